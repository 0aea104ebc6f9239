"""A controller that is a laptop: a user who is not root sets tandem up in a checkout of their own
(`make setup`) and drives the lab with it: fab info, prepare-data (the controller's rsync), predict,
and provisioning's train_env role (the agent's copy) with Ansible.

The user is made for the test (useradd) and removed after it, also on failure. They get a copy of the
lab's key and known_hosts and an inventory naming those copies; the lab itself stays root's. Their
`make setup` reads the shared virtualenv this session's root built ($TANDEM_CACHE) and makes their own
.venv on it; where that cache or the interpreter lies under a /root that only root may enter, the
user's commands run in a mount namespace in which /root holds just those two (read-only to them).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labtools import TOP, Run, ssh

DATASET = "laptop"


class LaptopUser:
    """A local user with a checkout of their own; `run` runs a shell command as them in it."""

    def __init__(self, name: str, staging: Path, cache: Path):
        self.name, self.staging, self.cache = name, staging, cache
        entry = pwd.getpwnam(name)
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.checkout = self.home / "tandem"
        # What the user's commands must reach that may lie under /root: the interpreter, the shared venv.
        root_only = not os.stat("/root").st_mode & 0o001
        self.keep = [p for p in (Path(sys.base_prefix).resolve(), cache.resolve())
                     if root_only and p.is_relative_to("/root")]

    def run(self, command: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        environment = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8",
                       "PATH": f"{self.checkout}/.venv/bin:/usr/local/bin:/usr/bin:/bin", "COLUMNS": "200", **env}
        as_user = shlex.join(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                              "env", "-i", *(f"{k}={v}" for k, v in environment.items()),
                              "bash", "-c", f"cd {shlex.quote(str(self.checkout))} && {command}"])
        if self.keep:  # /root: a tmpfs holding only the kept paths, in this command's own mount namespace
            binds = [f"mkdir -p {self.staging}/{i} && mount --bind {shlex.quote(str(p))} {self.staging}/{i}"
                     for i, p in enumerate(self.keep)]
            binds.append("mount -t tmpfs -o mode=755 tmpfs /root")
            binds += [f"mkdir -p {shlex.quote(str(p))} && mount --bind -o ro {self.staging}/{i} {shlex.quote(str(p))}"
                      for i, p in enumerate(self.keep)]
            argv = ["unshare", "--mount", "--propagation", "private", "bash", "-c",
                    " && ".join([*binds, f"exec {as_user}"])]
        else:
            argv = ["bash", "-c", as_user]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def end_processes_of(uid: int) -> None:
    """The test user's processes that outlived their command (an ssh ControlPersist master), by pid."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if proc.name.isdigit() and proc.stat().st_uid == uid:
                os.kill(int(proc.name), 9)


@pytest.fixture(scope="module")
def laptop(provisioned, tmp_path_factory):
    cfg = provisioned.cfg
    name = f"laptop{cfg.prefix}"[:32]
    if subprocess.run(["id", name], capture_output=True).returncode == 0:  # left by an interrupted run
        subprocess.run(["userdel", "--remove", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    user = None
    try:
        user = LaptopUser(name, tmp_path_factory.mktemp("laptop-binds"), cfg.cache)
        files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=TOP,
                               capture_output=True, text=True, check=True).stdout.split("\0")
        for rel in filter(None, files):
            if (TOP / rel).is_file():
                (user.checkout / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(TOP / rel, user.checkout / rel)
        dot_ssh = user.home / ".ssh"
        dot_ssh.mkdir(mode=0o700)
        shutil.copy(cfg.key, dot_ssh / "lab_key")
        shutil.copy(cfg.known_hosts, dot_ssh / "lab_known_hosts")
        inventory = provisioned.inventory.read_text().replace(str(cfg.key), str(dot_ssh / "lab_key")) \
            .replace(str(cfg.known_hosts), str(dot_ssh / "lab_known_hosts"))
        assert str(cfg.key) not in inventory and str(cfg.known_hosts) not in inventory
        (user.home / "lab.yml").write_text(inventory)
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(user.home)], check=True)
        (dot_ssh / "lab_key").chmod(0o600)
        yield user
    finally:
        if user is not None:
            end_processes_of(user.uid)
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        for host in cfg.names:
            ssh(cfg, host, f"rm -rf /data/tandem/datasets/{DATASET} /data/tandem/sources/{DATASET} "
                           f"/data/tandem/prepare/{DATASET}")
        assert subprocess.run(["id", name], capture_output=True).returncode != 0, f"user {name} is still there"


@pytest.fixture(scope="module")
def set_up(laptop):
    """The user's `make setup`: their own .venv on the controller's shared virtualenv (requirements.txt:
    no torch, no fairseq), no root, nothing installed. Root builds that virtualenv first, where the cache
    lacks it (the session's own .venv is the lab's and tests', requirements-dev.txt): once a machine."""
    built = subprocess.run(["bash", "lab/bootstrap.sh"], cwd=TOP, capture_output=True, text=True,
                           env=os.environ | {"TANDEM_CACHE": str(laptop.cache), "TANDEM_SHARED_ONLY": "1"})
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    start = time.monotonic()
    done = laptop.run("make setup", TANDEM_CACHE=str(laptop.cache), TANDEM_PYTHON=os.path.realpath(sys.executable))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "ready: .venv" in out and "installing system packages" not in out and "creating the shared" not in out
    assert time.monotonic() - start < 60, out
    return laptop


def fab(user: LaptopUser, *args: str) -> subprocess.CompletedProcess:
    return user.run(shlex.join([".venv/bin/fab", *args]), FABRIC_INVENTORY=str(user.home / "lab.yml"))


def test_a_user_who_is_not_root_sets_up_the_controller_and_asks_every_host(set_up):
    assert set_up.run("id -u").stdout.strip() == str(set_up.uid) != "0"
    modules = ("torch", "fairseq", "ansible_collections.ansible.posix")  # the controller's: the last alone
    light = set_up.run(".venv/bin/python -c " + shlex.quote(
        f"import importlib.util as u; print([m for m in {modules!r} if u.find_spec(m)])"))
    assert light.stdout.strip() == "['ansible_collections.ansible.posix']", light.stdout + light.stderr
    assert set_up.run(".venv/bin/python -c 'import train, sys; print(train.__file__)'").stdout.strip() == \
        str(set_up.checkout / "train" / "__init__.py")  # their checkout's tandem, not the session's
    info = fab(set_up, "info")
    assert info.returncode == 0, info.stdout + info.stderr
    assert "v100a" in info.stdout and "v100b" in info.stdout, info.stdout


def test_prepare_data_uploads_a_corpus_with_the_controllers_rsync_into_a_new_directory_then_predict_reads_it(
        set_up, provisioned):
    """--source: the user's corpus goes to rank 0's host with their rsync, into /data/tandem/sources/laptop,
    which does not exist (rsync's destination is made on the host first); the hosts prepare the rest."""
    for host in provisioned.cfg.names:
        assert ssh(provisioned.cfg, host, f"test -e /data/tandem/datasets/{DATASET}").returncode == 1
    corpus = set_up.home / DATASET
    set_up.run(shlex.join([".venv/bin/python", "-m", "train.agent.data.synthetic", str(corpus), "--train", "2000"]))
    done = fab(set_up, "prepare-data", "--source", str(corpus), "--vocab-size", "1000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical on every host (v100a, v100b)" in done.stdout, done.stdout
    assert ssh(provisioned.cfg, "v100a", f"test -s /data/tandem/sources/{DATASET}/train.en").returncode == 0
    predicted = fab(set_up, "predict", "--dataset", DATASET, "--link", "1000", "--compute-s", "0.1")
    assert predicted.returncode in (0, 3), predicted.stdout + predicted.stderr  # 3: network-bound
    assert "s/update" in predicted.stdout, predicted.stdout


def test_provisioning_copies_the_agent_from_the_users_checkout_without_rsync(set_up, provisioned):
    """train_env again, from the user's checkout (the same sources): nothing changes on the hosts."""
    done = set_up.run(shlex.join([".venv/bin/ansible-playbook", "-i", str(set_up.home / "lab.yml"), "provision.yml",
                                  "--tags", "train_env", "-e", f"tandem_report_dir={set_up.home}/reports"]),
                      timeout=600, ANSIBLE_NOCOLOR="1")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    recap = Run(done.returncode, out, 0).recap()
    assert set(recap) == set(provisioned.cfg.names), out[-4000:]
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap.values()), out[-4000:]
    assert "Copy tandem's host-side agent" in out

