"""The lab, brought up and provisioned once for the whole test session, and always torn down.

LAB_PREFIX / LAB_SUBNET pick another lab (so two checkouts can test side by side);
TANDEM_KEEP_LAB=1 leaves it running afterwards for a look around. Tests run in the order a
user works: unit (no lab), the lab itself, provisioning, training, the benchmarks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from labtools import TOP, Provisioned, fab, lab_cli

from lab.config import LabConfig

# torch's compiler, which any torch optimizer loads, refuses to load once ansible-core has patched
# sys.intern in the same process: where torch is installed it is loaded first (tests run fairseq's
# optimizers in-process beside tests that run fab's tasks, and so Ansible, in-process).
with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401

ORDER = ["unit", "lab_hosts", "provision", "training", "bench", "other_distro"]  # tests/<dir>, in a user's order
LAB_DIRS = set(ORDER) - {"unit"}


def _folder(item) -> str:
    return Path(item.path).relative_to(TOP / "tests").parts[0]


def pytest_collection_modifyitems(items):
    """Everything outside tests/unit needs the lab (root, namespaces) and is marked `lab`:
    `pytest -m "not lab"` (make unit) never starts one. Then the user's order."""
    for item in items:
        if _folder(item) in LAB_DIRS or {"lab", "spare_lab"} & set(item.fixturenames):
            item.add_marker(pytest.mark.lab)
    items.sort(key=lambda item: ORDER.index(_folder(item)) if _folder(item) in ORDER else len(ORDER))


@pytest.fixture(scope="session")
def lab():
    """A running lab: its LabConfig, with `inventory` pointing at the inventory it wrote."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    prefix = os.environ.get("LAB_PREFIX", "tandem")
    # The cloud VM's shape by default: SSH on eth0, a private cluster network on ens5.
    # LAB_CLUSTER_NET=0: one network (eth0) for everything.
    cluster_net = os.environ.get("LAB_CLUSTER_NET", "1") == "1"
    # A Debian cloud image's login by default (debian, passwordless sudo, no root login); LAB_LOGIN_USER=root:
    # a provider's root login.
    cfg = LabConfig(subnet=os.environ.get("LAB_SUBNET", "10.77.0.0/24"), prefix=prefix, cluster_net=cluster_net,
                    login_user=os.environ.get("LAB_LOGIN_USER", "debian"))
    try:
        lab_cli("up", "--subnet", cfg.subnet, "--cluster-net" if cluster_net else "--no-cluster-net",
                "--login-user", cfg.login_user, prefix=prefix)
        yield cfg
    finally:
        if os.environ.get("TANDEM_KEEP_LAB") != "1":
            lab_cli("down", prefix=prefix, check=False)


@pytest.fixture(scope="session")
def provisioned(lab, tmp_path_factory) -> Provisioned:
    """The lab after one full provision.yml run (which must succeed), shared by the whole session:
    provisioning's own tests, training and the benchmarks. TANDEM_ASSUME_PROVISIONED=1 skips the run
    on a lab you provisioned yourself."""
    # testinfra's ansible backend runs ansible-inventory: the controller venv's bin must be on PATH.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # A snapshot of the host-side agent, so that edits in the working tree during the tests do not
    # count as changes between provisioning's first and second run.
    code = tmp_path_factory.mktemp("code")
    shutil.copytree(TOP / "train", code / "train", ignore=shutil.ignore_patterns("__pycache__"))
    p = Provisioned(cfg=lab, inventory=lab.default_inventory, reports=tmp_path_factory.mktemp("provision"),
                    code=code)
    if os.environ.get("TANDEM_ASSUME_PROVISIONED") != "1":
        p.first = p.playbook()
        assert p.first.rc == 0, p.first.output[-6000:]
    return p


@pytest.fixture(scope="module")
def data_ready(provisioned) -> Provisioned:
    """The lab with the synthetic dataset prepared and checked identical on every host, once per
    module (the controller's cache makes it quick after the first)."""
    out = fab(provisioned, "prepare-data").stdout
    assert "identical on every host" in out
    return provisioned


@pytest.fixture(scope="session")
def two_by_two(request, tmp_path_factory) -> Provisioned:
    """2 hosts x 2 ranks (the inventory's cpu_ranks: 2, train_threads over all four ranks), provisioned
    (verify's all_reduce over every rank included) with the synthetic dataset prepared.

    In the suite: the session's lab, seen through an inventory of its own that differs only in
    those two variables (what a user edits to run several ranks a host): cpu_ranks changes nothing
    on the hosts but what verify measures, so provisioning it again is `--tags verify` (preflight
    always runs): verify's all_reduce, measured again for the new ranks (the whole playbook's second
    run, changed=0, is tests/provision's). A second lab and its first provisioning would add
    ~3.5 minutes to the suite; and once for the session (the modules that use it share it).
    LAB_RANKS_PREFIX (and LAB_RANKS_SUBNET, default 10.84.0.0/24) brings up a lab of its own instead
    (`lab up --ranks 2`), provisioned from scratch, and takes it down after the session."""
    if os.environ.get("LAB_RANKS_PREFIX"):
        yield from _own_two_by_two(tmp_path_factory)
        return
    session: Provisioned = request.getfixturevalue("provisioned")
    assert "identical on every host" in fab(session, "prepare-data").stdout
    cfg = LabConfig(hosts=session.cfg.hosts, subnet=session.cfg.subnet, prefix=session.cfg.prefix,
                    cluster_net=session.cfg.cluster_net, ranks=2)
    inventory = session.inventory.with_name(session.inventory.stem + "-2x2.yml")
    data = yaml.safe_load(session.inventory.read_text())
    data["all"]["vars"]["train_threads"] = cfg.threads_per_rank
    for host in data["all"]["children"]["cluster"]["hosts"].values():
        host["cpu_ranks"] = 2
    inventory.write_text("# the session's lab, 2 ranks a host (tests/conftest.py two_by_two)\n"
                         + yaml.safe_dump(data, sort_keys=False))
    try:
        p = Provisioned(cfg=cfg, inventory=inventory, reports=tmp_path_factory.mktemp("two-by-two"),
                        code=session.code)
        measured = session.reports / "network.json"  # the link verify compares with, as a user's reports/ holds it
        if measured.exists():
            shutil.copy(measured, p.reports / "network.json")
        p.first = p.playbook("--tags", "verify")
        assert p.first.rc == 0, p.first.output[-6000:]
        print(f"the lab as 2 x 2 ranks verified in {p.first.seconds:.0f} s")
        yield p
    finally:
        inventory.unlink(missing_ok=True)


def _own_two_by_two(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    cfg = LabConfig(prefix=os.environ["LAB_RANKS_PREFIX"], subnet=os.environ.get("LAB_RANKS_SUBNET", "10.84.0.0/24"),
                    ranks=2)
    try:
        lab_cli("up", "--subnet", cfg.subnet, "--ranks", "2", prefix=cfg.prefix)
        p = Provisioned(cfg=cfg, inventory=cfg.default_inventory, reports=tmp_path_factory.mktemp("two-by-two"))
        p.first = p.playbook()
        assert p.first.rc == 0, p.first.output[-6000:]
        print(f"2 x 2 ranks lab provisioned in {p.first.seconds:.0f} s")
        assert "identical on every host" in fab(p, "prepare-data").stdout
        yield p
    finally:
        if os.environ.get("TANDEM_KEEP_LAB") != "1":
            lab_cli("down", prefix=cfg.prefix, check=False)
