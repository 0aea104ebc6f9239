"""Hosts whose Debian and Python are not the controller's: Debian 13 (Python 3.13) provisioned from
this Debian 12 controller (Python 3.11), as a user's Ubuntu 24.04 VMs (3.12) would be. The
wheelhouse build for 3.13 (torch's CUDA 13.0 build from PyPI: the CPU one for 3.13 is not reachable
from here) installs there; fairseq's wheel, which the wheelhouse has only as source for 3.13, is
built once on one host and shared; then the user's whole job runs: prepare-data, train, evaluate,
report. Its own lab (prefix tdm13), on the two-network shape."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time

import pytest
from labtools import TOP, Provisioned, fab, lab_cli, ssh

from lab.config import LabConfig

RUN = time.strftime("run-debian13-%Y%m%d-%H%M%S")


pytestmark = pytest.mark.own_lab  # a lab of its own: `make test-labs` (docs/lab.md has its last figures)


@pytest.fixture(scope="module")
def debian13(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    cfg = LabConfig(prefix="tdm13", subnet="10.83.0.0/24", distro="trixie")
    try:
        lab_cli("up", "--subnet", cfg.subnet, "--distro", cfg.distro, prefix=cfg.prefix)
        p = Provisioned(cfg=cfg, inventory=cfg.default_inventory, reports=tmp_path_factory.mktemp("debian13"))
        # The all_reduce check is the pair lab's to test; the whole job below trains across both hosts.
        p.first = p.playbook("-e", "verify_allreduce=false", timeout=1800)
        assert p.first.rc == 0, p.first.output[-6000:]
        yield p
    finally:
        if os.environ.get("TANDEM_KEEP_LAB") != "1":
            lab_cli("down", prefix=cfg.prefix, check=False)


def test_debian_13_hosts_get_an_environment_for_their_own_python(debian13):
    cfg, out = debian13.cfg, debian13.first.output
    print(f"provisioned 2 Debian 13 hosts in {debian13.first.seconds:.0f} s")
    for name in cfg.names:
        assert ssh(cfg, name, ". /etc/os-release && echo $VERSION_ID").stdout.strip() == "13"
        probed = json.loads(ssh(cfg, name, "/opt/tandem/venv/bin/python -m train.agent.measure.probe").stdout)
        assert probed["python"].startswith("3.13.") and probed["torch"] == "2.13.0+cu130", probed
        assert probed["cuda"] == "13.0", probed  # the wheelhouse's CUDA build, not the controller's CPU one
        assert probed["fairseq"] == "0.12.3.1" and "import_error" not in probed, probed
    # fairseq's wheel for 3.13: built on one host (or, on a later run, taken from the controller's
    # cache), and the very same file installed on both
    wheel = "fairseq_fixed-0.12.3.1-cp313-cp313-linux_x86_64.whl"
    kept = cfg.cache / "wheels" / wheel
    assert kept.exists(), sorted((cfg.cache / "wheels").iterdir())
    want = hashlib.sha256(kept.read_bytes()).hexdigest()
    for name in cfg.names:
        assert ssh(cfg, name, f"sha256sum /opt/tandem/wheels/{wheel}").stdout.split()[:1] == [want], name
    # the verification table names the Python and the torch build on each host
    for name in cfg.names:
        row = rf"{name}\s+0/0\s+-\s+2\.13\.0\+cu130\s+no\s+ens5\s.*\s3\.13\.\d+\s+0\.12\.3\.1"
        assert re.search(row, out), out[-3000:]


def test_debian_13_hosts_run_the_whole_job(debian13):
    """prepare-data, train (a short run), evaluate, report: as on the Debian 12 lab."""
    assert "identical on every host" in fab(debian13, "prepare-data").stdout
    out = fab(debian13, "train", "--new", "--run", RUN, "--set", "max_update=40,save_interval_updates=20").stdout
    assert "40/40" in out, out[-3000:]
    scored = fab(debian13, "evaluate", "--run", RUN).stdout
    assert re.search(r"BLEU\s*=?\s*[\d.]+", scored), scored[-2000:]
    fab(debian13, "report", "--run", RUN)
    assert (TOP / "reports" / RUN / "index.html").exists()
