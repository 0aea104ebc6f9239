"""Starting and stopping one lab host: its disk, overlay root, sshd and data device.

A host is `unshare --mount --pid --uts --fork --kill-child` inside its network namespace,
chrooted into an overlay of the cached root filesystem, with tini as PID 1 reaping what
sshd's sessions leave behind. Killing the unshare process ends the host: its processes,
mounts and overlay go with it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

from lab import rootfs
from lab.config import LabConfig
from lab.shell import LabError, run

SSHD_CONFIG = """\
# tandem lab: key-only login as {user}, like a freshly rented VM
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin {permit_root}
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
"""
# What cloud-init puts in root's authorized_keys when root may not log in (disable_root): the key, and
# a message instead of a shell. sshd refuses root before it matters (PermitRootLogin no); the key is
# there so that a test of that refusal is not answered by a missing key.
ROOT_KEY_OPTIONS = ('no-port-forwarding,no-agent-forwarding,no-X11-forwarding,'
                    'command="echo \'Please login as the user \\"{user}\\" rather than the user \\"root\\".\';'
                    'echo;exit 142" ')


# The lab host's init, after its root is mounted: what systemd does at a VM's boot that tandem relies on.
INIT = ("mount -a 2>/dev/null; [ -x /usr/local/sbin/tandem-boot ] && setsid /usr/local/sbin/tandem-boot "
        ">/var/log/tandem-boot.log 2>&1 & exec /usr/sbin/sshd -D -e")


def sshd_config(login_user: str) -> str:
    """Root logs in only where it is the login user; otherwise sshd refuses it, as on cloud images."""
    return SSHD_CONFIG.format(user=login_user, permit_root="prohibit-password" if login_user == "root" else "no")


def authorized_keys(login_user: str, public_key: str) -> dict[str, str]:
    """{user: the authorized_keys text} the lab writes: the key for the login user, and for root the
    cloud-init line that sends it to the login user."""
    keys = {login_user: public_key}
    if login_user != "root":
        keys["root"] = ROOT_KEY_OPTIONS.format(user=login_user) + public_key
    return keys


def passwd_entry(root: Path, user: str) -> tuple[int, int, str]:
    """(uid, gid, home) of `user` in the root filesystem at `root`."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3]), fields[5]
    raise LabError(f"the lab's root filesystem {root} has no user {user!r}: rebuild it (remove it, then lab up)")


def _mkdir_like(upper: Path, lower: Path, relative: str) -> Path:
    """Make `relative` in the overlay's upper layer, each directory with the owner and mode the lower
    layer gives it (an upper directory's own attributes win in the merged view: /home/debian made
    here as root's would lock its user out of ssh)."""
    path = upper
    for part in Path(relative).parts:
        path = path / part
        below = lower / path.relative_to(upper)
        if not path.exists():
            path.mkdir()
            if below.is_dir():
                st = below.stat()
                os.chown(path, st.st_uid, st.st_gid)
                os.chmod(path, st.st_mode & 0o7777)
    return path


def install_keys(cfg: LabConfig, upper: Path, public_key: str) -> None:
    """Each user's ~/.ssh/authorized_keys in the host's upper layer, owned by that user, as sshd wants."""
    lower = rootfs.rootfs_dir(cfg.cache, cfg.distro)
    for user, text in authorized_keys(cfg.login_user, public_key).items():
        uid, gid, home = passwd_entry(lower, user)
        ssh = _mkdir_like(upper, lower, home.lstrip("/")) / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / "authorized_keys").write_text(text)
        os.chmod(ssh / "authorized_keys", 0o600)
        for path in (ssh, ssh / "authorized_keys"):
            os.chown(path, uid, gid)


def prepare_disk(cfg: LabConfig, name: str, public_key: str) -> str:
    """Write the host's own files into its overlay's upper layer; returns its host key line."""
    host = cfg.host_dir(name)
    upper = host / "upper"
    for sub in ("upper", "work", "root"):
        (host / sub).mkdir(parents=True, exist_ok=True)
    (upper / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (upper / "etc/ssh/sshd_config.d/tandem-lab.conf").write_text(sshd_config(cfg.login_user))
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
    install_keys(cfg, upper, public_key)
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
        # as a VM's init does: mount what fstab names (/data), run tandem-boot (roles/train_env), then sshd
        f"exec chroot {root} /usr/bin/tini -s -- /bin/sh -c {shlex.quote(INIT)}",
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


def wait_for_exec(cfg: LabConfig, name: str, pid: int, timeout: float = 5) -> None:
    """Until the launcher just started is recognisable as this host's (its command line, once exec'd)."""
    deadline = time.monotonic() + timeout
    while host_pid(cfg, name) != pid and time.monotonic() < deadline:
        time.sleep(0.05)


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
