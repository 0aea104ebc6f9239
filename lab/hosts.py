"""Starting and stopping one lab host: its disk, overlay root, sshd and data device.

A host is `unshare --mount --pid --uts --fork --kill-child` inside its network namespace,
chrooted into an overlay of the cached root filesystem, with tini as PID 1 reaping what
sshd's sessions leave behind. Killing the unshare process ends the host: its processes,
mounts and overlay go with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import rootfs
from .config import LabConfig
from .shell import LabError, run

SSHD_CONFIG = """\
# tandem lab: key-only root login, like a freshly rented VM
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
"""


def prepare_disk(cfg: LabConfig, name: str, public_key: str) -> str:
    """Write the host's own files into its overlay's upper layer; returns its host key line."""
    host = cfg.host_dir(name)
    upper = host / "upper"
    for sub in ("upper", "work", "root"):
        (host / sub).mkdir(parents=True, exist_ok=True)
    (upper / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (upper / "etc/ssh/sshd_config.d/tandem-lab.conf").write_text(SSHD_CONFIG)
    keyfile = upper / "etc/ssh/ssh_host_ed25519_key"
    if not keyfile.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(keyfile))
    (upper / "etc/hostname").write_text(f"{name}\n")
    (upper / "etc/hosts").write_text(f"127.0.0.1 localhost\n{cfg.host_ip(name)} {name}\n")
    (upper / "etc/apt").mkdir(parents=True, exist_ok=True)
    (upper / "etc/apt/sources.list").write_text(
        f"# the tandem lab's apt repository (the hosts have no route off this machine)\n"
        f"deb [trusted=yes] {cfg.repo_url}/apt ./\n"
    )
    ssh = upper / "root/.ssh"
    ssh.mkdir(parents=True, exist_ok=True, mode=0o700)
    (ssh / "authorized_keys").write_text(public_key)
    os.chmod(ssh / "authorized_keys", 0o600)
    key_type, key = keyfile.with_suffix(".pub").read_text().split()[:2]
    return f"{key_type} {key}"


def attach_data_disk(cfg: LabConfig, name: str) -> str:
    """A sparse file on a loop device: the host's empty 'attached volume'."""
    image = cfg.host_dir(name) / "data.img"
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(cfg.data_disk_gb * 1024**3)
    existing = run("losetup", "-j", str(image)).stdout.strip()
    if existing:
        return existing.split(":")[0]
    return run("losetup", "--find", "--show", str(image)).stdout.strip()


def detach_data_disks(cfg: LabConfig) -> list[str]:
    detached = []
    out = run("losetup", "-l", "-n", "-O", "NAME,BACK-FILE", check=False).stdout
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].startswith(str(cfg.state)):
            run("losetup", "-d", parts[0], check=False)
            detached.append(parts[0])
    return detached


def start(cfg: LabConfig, name: str) -> int:
    host = cfg.host_dir(name)
    root = host / "root"
    lower = rootfs.rootfs_dir(cfg.cache, cfg.distro)
    boot = " && ".join([
        f"mount -t overlay overlay -o lowerdir={lower},upperdir={host / 'upper'},workdir={host / 'work'} {root}",
        f"mount -t proc proc {root}/proc",
        f"mount -t sysfs sysfs {root}/sys",
        f"mount --rbind /dev {root}/dev",
        f"mount -t tmpfs -o mode=1777 shm {root}/dev/shm",
        f"mount -t tmpfs -o mode=755 run {root}/run",
        f"mkdir -p {root}/run/sshd",
        f"hostname {name}",
        f"exec chroot {root} /usr/bin/tini -s -- /usr/sbin/sshd -D -e",
    ])
    with open(host / "console.log", "ab") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", cfg.netns(name),
             "unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child", "--propagation", "private",
             "sh", "-c", boot],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    (host / "pid").write_text(str(proc.pid))
    return proc.pid


def wait_for_ssh(cfg: LabConfig, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers_ssh(cfg.host_ip(name)):
            return
        pid = host_pid(cfg, name)
        if pid is None:
            log = (cfg.host_dir(name) / "console.log").read_text(errors="replace")[-2000:]
            raise LabError(f"{name}: the host stopped while starting; its console said:\n{log}")
        time.sleep(0.2)
    raise LabError(f"{name}: sshd did not answer on {cfg.host_ip(name)}:22 within {timeout:.0f} s")


def answers_ssh(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def host_pid(cfg: LabConfig, name: str) -> int | None:
    """The host's launcher PID, if it is still the process this lab started."""
    pidfile = cfg.host_dir(name) / "pid"
    try:
        pid = int(pidfile.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    # The launcher execs into unshare, whose boot script names the host's directory.
    return pid if any(str(cfg.host_dir(name)).encode() in arg for arg in cmdline) else None


def stop(cfg: LabConfig, name: str) -> list[str]:
    """End the host: its launcher (and so PID 1), then anything still in its namespace."""
    stopped = []
    pid = host_pid(cfg, name)
    if pid is not None:
        kill_and_wait(pid)
        stopped.append(f"{name} (pid {pid})")
    ns = cfg.netns(name)
    leftovers = run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid_text in leftovers:
        kill_and_wait(int(pid_text))
        stopped.append(f"{name} process {pid_text}")
    return stopped


def kill_and_wait(pid: int, timeout: float = 10) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        with contextlib.suppress(ChildProcessError):  # reap it if it is our own child
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
