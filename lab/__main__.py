"""`python -m lab up|down|status|shape`: the local lab behind `make lab-*`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from lab import hosts, inventory, network, rootfs
from lab.config import DISTROS, LOGIN_USERS, LabConfig
from lab.shell import LabError, run

console = Console(highlight=False, soft_wrap=True)


def step(text: str):
    """A spinner while a step runs, then a line with how long it took."""

    class _Step:
        def __enter__(self):
            self.start = time.monotonic()
            self.status = console.status(text + " ...")
            self.status.__enter__()

        def __exit__(self, exc_type, *rest):
            self.status.__exit__(exc_type, *rest)
            mark = "[green]✓[/]" if exc_type is None else "[red]✗[/]"
            console.print(f"{mark} {text} [dim]({time.monotonic() - self.start:.1f} s)[/]")

    return _Step()


def saved_config(prefix: str) -> LabConfig | None:
    path = LabConfig(prefix=prefix).state / "lab.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return LabConfig(hosts=data["hosts"], subnet=data["subnet"], prefix=prefix,
                     http_port=data.get("http_port", 8080),
                     slow_nic_hosts=tuple(data.get("slow_nic_hosts", ())),
                     cluster_net=bool(data.get("cluster_net", False)),
                     distro=data.get("distro", "bookworm"),
                     # a lab started before the login user was a setting logged in as root
                     login_user=data.get("login_user", "root"), ranks=int(data.get("ranks", 1)),
                     data_disk_gb=int(data.get("data_disk_gb", 4)))


def server_pid(cfg: LabConfig) -> int | None:
    try:
        pid = int((cfg.state / "http.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"http.server" in cmdline and str(cfg.state).encode() in cmdline else None


def healthy(cfg: LabConfig) -> bool:
    return (
        server_pid(cfg) is not None
        and all(hosts.host_pid(cfg, n) and hosts.answers_ssh(cfg.host_ip(n)) for n in cfg.names)
    )


def refresh_inventory(cfg: LabConfig) -> Path | None:
    """A running lab's inventory as this checkout renders it (a pull may add variables);
    returns its path when it changed."""
    record = cfg.state / "inventory"
    path = Path(record.read_text()) if record.exists() else None
    if path is None or not path.exists():
        return None
    hosts_now = yaml.safe_load(path.read_text())["all"]["children"]["cluster"]["hosts"]
    text = inventory.render(cfg, {name: hosts_now[name]["data_device"] for name in cfg.names})
    if text == path.read_text():
        return None
    path.write_text(text)
    return path


def describe(cfg: LabConfig) -> str:
    """'2 Debian bookworm hosts on 10.77.0.0/24, two networks, login debian': what tells two labs apart."""
    slow = f", slow NIC on {','.join(cfg.slow_nic_hosts)}" if cfg.slow_nic_hosts else ""
    ranks = f", {cfg.ranks} ranks a host" if cfg.ranks > 1 else ""
    return (f"{cfg.hosts} Debian {cfg.distro} hosts on {cfg.subnet}, "
            f"{'two networks' if cfg.cluster_net else 'one network'}{slow}{ranks}, login {cfg.login_user}")


def already_up(cfg: LabConfig) -> bool:
    """True when this very lab runs already (its inventory refreshed); raises for a different one."""
    running = saved_config(cfg.prefix)
    if running is None or not healthy(running):
        return False
    if describe(running) != describe(cfg):
        raise LabError(f"a lab of {describe(running)} is running: `make lab-down` first to start one of "
                       f"{describe(cfg)}")
    refreshed = refresh_inventory(running)
    console.print(f"[green]✓[/] the lab is already up ({', '.join(cfg.names)}): "
                  + (f"inventory {refreshed} rewritten (this checkout writes it differently)" if refreshed
                     else "nothing changed"))
    return True


def cached_images(cfg: LabConfig) -> Path:
    """The Debian root filesystem and the training wheelhouse, built once; the wheelhouse's path."""
    if not rootfs.is_built(cfg.cache, cfg.distro):
        with step(f"building the hosts' Debian ({cfg.distro}) root filesystem with mmdebstrap (once, cached)"):
            rootfs.build(cfg.cache, cfg.distro)
    from train.provision import wheelhouse

    with step(f"the training wheelhouse the hosts install from (Python {cfg.python}, torch {cfg.accelerator}; "
              "built once, cached)"):
        return wheelhouse.build(python=cfg.python, accelerator=cfg.accelerator)


def serve_packages(cfg: LabConfig, wheels: Path) -> None:
    """The bridge, and the apt repository and wheelhouse served on its address (the hosts' only source)."""
    with step(f"bridge {cfg.bridge} on {cfg.subnet} (no route off this machine)"):
        network.create_bridge(cfg)
        www = cfg.state / "www"
        www.mkdir()
        (www / "apt").symlink_to(rootfs.repo_dir(cfg.cache, cfg.distro))
        (www / "wheels").symlink_to(wheels)
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", cfg.bridge_ip, "--directory", str(www),
             str(cfg.http_port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        (cfg.state / "http.pid").write_text(str(server.pid))


def start_hosts(cfg: LabConfig, public_key: str) -> dict[str, str]:
    """Every host: namespace, overlay root, data disk, sshd; their keys in known_hosts. {name: data device}."""
    known, devices = [], {}
    for name in cfg.names:
        with step(f"host {name} at {cfg.host_ip(name)}: namespace, overlay root, data disk, sshd"):
            network.attach_host(cfg, name)
            if cfg.cluster_net:
                network.attach_cluster_nic(cfg, name)
            if name in cfg.slow_nic_hosts:
                network.attach_slow_nic(cfg, name)
            host_key = hosts.prepare_disk(cfg, name, public_key)
            known.append(f"{name},{cfg.host_ip(name)} {host_key}\n")
            devices[name] = hosts.attach_data_disk(cfg, name)
            hosts.start(cfg, name)
    cfg.known_hosts.write_text("".join(known))
    with step("waiting for sshd on every host"):
        for name in cfg.names:
            hosts.wait_for_ssh(cfg, name)
    return devices


def reboot(cfg: LabConfig, name: str, down_for_s: float = 60.0) -> None:
    """What a VM's reboot does to tandem: every process gone, the host silent for `down_for_s` (a VM
    takes a minute or so), the data volume kept, sshd back by itself, and the host's init (mount -a,
    tandem-boot) run again."""
    if name not in cfg.names:
        raise LabError(f"no host {name} in this lab ({', '.join(cfg.names)})")
    with step(f"rebooting {name}: every process ended, off for {down_for_s:g} s, its disks kept"):
        hosts.stop(cfg, name)
        time.sleep(down_for_s)
        for attempt in (1, 2):  # a launcher ended while its namespace's last processes went: once more
            hosts.stop(cfg, name)
            pid = hosts.start(cfg, name)
            hosts.wait_for_exec(cfg, name, pid)
            try:
                hosts.wait_for_ssh(cfg, name)
                return
            except LabError:
                if attempt == 2:
                    raise


def up(cfg: LabConfig, inventory_path: Path) -> None:
    if already_up(cfg):
        return
    network.require_privileges()
    running = saved_config(cfg.prefix)
    if running is not None or network.existing_namespaces(cfg) or cfg.state.exists():
        with step("clearing what a crashed or half-finished lab left"):
            down(running or cfg, quiet=True)
    network.require_free_subnet(cfg)
    started = time.monotonic()
    wheels = cached_images(cfg)
    cfg.state.mkdir(parents=True, exist_ok=True)
    (cfg.state / "lab.json").write_text(json.dumps(
        {"hosts": cfg.hosts, "subnet": cfg.subnet, "http_port": cfg.http_port,
         "slow_nic_hosts": list(cfg.slow_nic_hosts), "cluster_net": cfg.cluster_net, "distro": cfg.distro,
         "login_user": cfg.login_user, "ranks": cfg.ranks, "data_disk_gb": cfg.data_disk_gb}))
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tandem-lab", "-f", str(cfg.key))
    serve_packages(cfg, wheels)
    if cfg.cluster_net:
        network.create_cluster_bridge(cfg)
    devices = start_hosts(cfg, cfg.key.with_suffix(".pub").read_text())
    inventory_path.parent.mkdir(parents=True, exist_ok=True)
    inventory_path.write_text(inventory.render(cfg, devices))
    (cfg.state / "inventory").write_text(str(inventory_path))
    console.print(f"[bold green]lab up[/] in {time.monotonic() - started:.1f} s: "
                  f"{', '.join(cfg.names)}; inventory {inventory_path}")


def down(cfg: LabConfig, quiet: bool = False) -> None:
    """Remove everything the lab made, whatever state it is in."""
    removed: list[str] = []
    pid = server_pid(cfg)
    if pid is not None:
        hosts.kill_and_wait(pid)
        removed.append(f"repository server (pid {pid})")
    for name in _known_host_names(cfg):
        removed += hosts.stop(cfg, name)
    removed += network.remove(cfg)
    removed += [f"loop device {d}" for d in hosts.detach_data_disks(cfg)]
    for mount in _mounts_under(cfg.state):
        run("umount", "-l", mount, check=False)
        removed.append(f"mount {mount}")
    if cfg.state.exists():
        try:
            inventory_file = Path((cfg.state / "inventory").read_text())
            inventory_file.unlink(missing_ok=True)
        except OSError:
            pass
        shutil.rmtree(cfg.state)
        removed.append(f"state {cfg.state}")
    if not quiet:
        console.print("[green]✓[/] lab down: " + ("; ".join(removed) if removed else "nothing was running"))


def _known_host_names(cfg: LabConfig) -> list[str]:
    names = set(cfg.names)
    if (cfg.state / "hosts").exists():
        names |= {p.name for p in (cfg.state / "hosts").iterdir()}
    return sorted(names)


def _mounts_under(path: Path) -> list[str]:
    out = run("findmnt", "-rn", "-o", "TARGET", check=False).stdout.splitlines()
    return sorted((m for m in out if m.startswith(str(path) + "/")), key=len, reverse=True)


def status(cfg: LabConfig) -> int:
    running = saved_config(cfg.prefix)
    if running is None:
        console.print("the lab is down")
        return 1
    caps = network.current_caps(running) if network.existing_namespaces(running) else {}
    table = Table(title=f"tandem lab on {running.subnet}, login {running.login_user}")
    for column in ("host", "address", "pid", "ssh", "link cap"):
        table.add_column(column)
    for name in running.names:
        pid = hosts.host_pid(running, name)
        ssh = hosts.answers_ssh(running.host_ip(name))
        table.add_row(name, running.host_ip(name), str(pid or "-"),
                      "[green]up[/]" if ssh else "[red]down[/]", caps.get(name) or "none")
    console.print(table)
    ok = healthy(running)
    console.print("repository server: " + ("up" if server_pid(running) else "[red]down[/]"))
    return 0 if ok else 1


def shape(cfg: LabConfig, rate: str) -> None:
    running = saved_config(cfg.prefix)
    if running is None:
        raise LabError("the lab is down: `make lab-up` first")
    network.shape(running, rate)  # raises on a rate tc would not understand, before touching a host
    if rate.lower() in ("none", "off", ""):
        console.print("[green]✓[/] bandwidth cap lifted on " + ", ".join(running.names))
    else:
        console.print(f"[green]✓[/] {rate} cap (tc tbf, egress of {network.link_nic(running)}) on "
                      + ", ".join(running.names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    parser.add_argument("--prefix", default=os.environ.get("LAB_PREFIX", "tandem"),
                        help="names this lab's namespaces and links (default tandem)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the lab (does nothing if it runs)")
    p_up.add_argument("--hosts", type=int, default=2, help="number of hosts (default 2)")
    p_up.add_argument("--subnet", default="10.77.0.0/24")
    p_up.add_argument("--inventory", type=Path, help="where to write the inventory")
    p_up.add_argument("--slow-nic", default="", help="hosts (comma-separated) that also get eth1, "
                      "a NIC reporting 100 Mb/s to ethtool")
    p_up.add_argument("--cluster-net", action=argparse.BooleanOptionalAction, default=True,
                      help="a private cluster network on a second bridge (ens5, cluster_address), SSH on the "
                      "management network (eth0), as on cloud VMs (the default); --no-cluster-net: one network")
    p_up.add_argument("--ranks", type=int, default=1,
                      help="training ranks on each host (the inventory's cpu_ranks; default 1): 2 runs the "
                      "several-ranks-a-host path multi-GPU hosts take")
    p_up.add_argument("--data-disk-gb", type=int, default=4,
                      help="each host's /data volume, GB (default 4; sparse: disk is used as it fills). "
                           "WMT16 at full size (prepare-data --wmt16) needs ~16")
    p_up.add_argument("--distro", default="bookworm", choices=sorted(DISTROS),
                      help="the hosts' Debian: bookworm (12, Python 3.11, the default) or trixie (13, Python 3.13)")
    p_up.add_argument("--login-user", default="debian", choices=sorted(LOGIN_USERS),
                      help="who tandem logs in as: debian (passwordless sudo, sshd refuses root, as on Debian's "
                      "cloud images; the default) or root")
    sub.add_parser("down", help="remove everything the lab made")
    sub.add_parser("status", help="show the hosts and caps")
    p_reboot = sub.add_parser("reboot", help="end every process of a host and start it again, its disks kept "
                              "(a cloud maintenance event, a spot VM restarted)")
    p_reboot.add_argument("host")
    p_reboot.add_argument("--down-for", type=float, default=60.0,
                          help="seconds the host stays off, as a VM's reboot takes (default 60)")
    p_shape = sub.add_parser("shape", help="cap the link between hosts (tc tbf), or RATE=none")
    p_shape.add_argument("rate", help="e.g. 100mbit, 1gbit, none")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            slow = tuple(h for h in args.slow_nic.split(",") if h)
            cfg = LabConfig(hosts=args.hosts, subnet=args.subnet, prefix=args.prefix, slow_nic_hosts=slow,
                            cluster_net=args.cluster_net, distro=args.distro, login_user=args.login_user,
                            ranks=args.ranks, data_disk_gb=args.data_disk_gb)
            up(cfg, args.inventory or cfg.default_inventory)
        elif args.command == "down":
            down(saved_config(args.prefix) or LabConfig(prefix=args.prefix))
        elif args.command == "status":
            return status(LabConfig(prefix=args.prefix))
        elif args.command == "reboot":
            reboot(saved_config(args.prefix) or LabConfig(prefix=args.prefix), args.host, args.down_for)
        elif args.command == "shape":
            shape(LabConfig(prefix=args.prefix), args.rate)
    except (LabError, ValueError) as err:
        console.print(f"[red]lab {args.command} failed:[/] {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
