"""The lab's pure parts: names, addresses, rates, the inventory it writes."""

from __future__ import annotations

import os

import pytest
import yaml

from lab import hosts, inventory, network, rootfs
from lab.config import LabConfig, host_names
from lab.shell import LabError
from train.cluster import ClusterError, load_hosts, select


def test_hosts_are_named_like_the_field_reports_vms():
    assert host_names(2) == ["v100a", "v100b"]
    assert host_names(4)[-1] == "v100d"
    with pytest.raises(ValueError, match="1 to 26 hosts"):
        host_names(0)


def test_addresses_and_names_fit_linux_limits():
    cfg = LabConfig(hosts=4, prefix="tdmspare", subnet="10.79.0.0/24")
    assert cfg.bridge_ip == "10.79.0.1"
    assert [cfg.host_ip(n) for n in cfg.names] == ["10.79.0.11", "10.79.0.12", "10.79.0.13", "10.79.0.14"]
    assert all(len(name) <= 15 for name in [cfg.bridge, *map(cfg.veth, cfg.names)])


def test_bad_lab_settings_are_refused():
    with pytest.raises(ValueError, match="too small"):
        LabConfig(hosts=4, subnet="10.77.0.0/29")
    with pytest.raises(ValueError, match="prefix"):
        LabConfig(prefix="a-much-too-long-prefix")


@pytest.mark.parametrize("rate", ["fast", "100", "-5mbit", "0mbit"])
def test_a_rate_tc_would_not_understand_is_refused_before_any_host_is_touched(rate):
    cfg = LabConfig(prefix="tdmnone")  # no such lab: shape would fail on its namespaces if it got there
    with pytest.raises(LabError, match="not a tc rate"):
        network.shape(cfg, rate)


def test_the_inventory_the_lab_writes_resolves_through_ansible(tmp_path):
    cfg = LabConfig(hosts=3, cluster_net=False)  # one network: eth0 for everything
    path = tmp_path / "lab.yml"
    path.write_text(inventory.render(cfg, {n: f"/dev/loop{i}" for i, n in enumerate(cfg.names)}))
    hosts = load_hosts(path)
    assert [(h.name, h.address, h.gpus, h.nic) for h in hosts] == [
        ("v100a", "10.77.0.11", 0, "eth0"), ("v100b", "10.77.0.12", 0, "eth0"), ("v100c", "10.77.0.13", 0, "eth0")]
    assert hosts[1].data_device == "/dev/loop1"
    assert hosts[0].key == str(cfg.key) and hosts[0].known_hosts == str(cfg.known_hosts)
    assert [h.ranks for h in hosts] == [1, 1, 1]
    path.write_text(inventory.render(LabConfig(ranks=2), {n: "/dev/loop0" for n in ("v100a", "v100b")}))
    assert [h.ranks for h in load_hosts(path)] == [2, 2]  # cpu_ranks, read as Fabric's tasks read it


def test_the_two_network_lab_describes_a_cloud_vms_addresses(tmp_path):
    """SSH to eth0's address (ansible_host), everything host to host over ens5 (cluster_address)."""
    cfg = LabConfig(prefix="tdmtwo", subnet="10.79.0.0/24")  # the default shape
    path = tmp_path / "lab.yml"
    path.write_text(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))
    assert [(h.address, h.cluster_address, h.nic) for h in load_hosts(path)] == [
        ("10.79.0.11", "172.30.0.11", "ens5"), ("10.79.0.12", "172.30.0.12", "ens5")]
    # what lab-shape caps
    assert network.link_nic(cfg) == "ens5" and network.link_nic(LabConfig(cluster_net=False)) == "eth0"
    assert cfg.peer_ip("v100b") == "172.30.0.12" and cfg.links("v100b") == ["tdmtwo-v100b", "tdmtwo-v100bc"]


def test_a_debian_13_lab_gets_its_pythons_wheelhouse_build(tmp_path):
    """Debian 13's hosts run Python 3.13: the inventory asks for the wheelhouse build with torch's
    CUDA 13.0 (PyPI's build for 3.13; the CPU one is not reachable from here)."""
    cfg = LabConfig(distro="trixie")
    assert (cfg.python, cfg.accelerator) == ("3.13", "cu130")
    rendered = yaml.safe_load(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))
    assert rendered["all"]["vars"]["train_env_accelerator"] == "cu130"
    with pytest.raises(ValueError, match="bookworm or trixie, not 'jammy'"):
        LabConfig(distro="jammy")
    assert all(len(n) <= 15 for n in [cfg.cluster_bridge, *map(cfg.cluster_veth, cfg.names)])


def test_an_unknown_host_is_named_with_the_hosts_that_exist(tmp_path):
    cfg = LabConfig()
    path = tmp_path / "lab.yml"
    path.write_text(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))
    hosts = load_hosts(path)
    assert [h.name for h in select(hosts, ["v100b", "v100a"])] == ["v100b", "v100a"]
    with pytest.raises(ClusterError, match="unknown host v100z: the inventory has v100a, v100b"):
        select(hosts, ["v100a", "v100z"])


def test_a_missing_inventory_says_how_to_make_one(tmp_path):
    with pytest.raises(ClusterError, match="make lab-up"):
        load_hosts(tmp_path / "nope.yml")


def test_without_network_namespaces_the_lab_says_what_to_do(monkeypatch):
    # A kernel without namespaces cannot exist on this machine: stand in for its answer.
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setattr(network, "ok", lambda *args: False)
    with pytest.raises(LabError, match="does not allow network namespaces"):
        network.require_privileges()


def test_a_slow_nic_is_the_cluster_nic_of_its_host():
    """SLOW_NIC=v100b: v100b's cluster NIC reports 100 Mb/s, like a VM on a 100 Mb/s port."""
    cfg = LabConfig(hosts=2, slow_nic_hosts=("v100b",))
    hosts = yaml.safe_load(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))["all"]["children"][
        "cluster"]["hosts"]
    assert hosts["v100a"]["cluster_nic"] == "ens5" and hosts["v100b"]["cluster_nic"] == "eth1"


def test_a_running_lab_of_another_shape_is_described_by_what_differs():
    """`lab up` refuses a lab that runs with another shape, naming both: the same host count and
    subnet must not read as the same lab."""
    from lab.__main__ import describe

    assert describe(LabConfig()) == "2 Debian bookworm hosts on 10.77.0.0/24, two networks, login debian"
    assert describe(LabConfig(cluster_net=False, distro="trixie", slow_nic_hosts=("v100b",), login_user="root")) == (
        "2 Debian trixie hosts on 10.77.0.0/24, one network, slow NIC on v100b, login root")


def test_the_lab_logs_in_as_a_cloud_images_user_who_becomes_root_with_sudo(tmp_path):
    """The default shape is a Debian cloud image's: its inventory logs in as `debian` with become (as
    inventory/hosts.yml does for `ubuntu`), sshd refuses root, whose authorized_keys sends it to debian."""
    cfg = LabConfig()
    path = tmp_path / "lab.yml"
    path.write_text(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))
    assert {h.user for h in load_hosts(path)} == {"debian"}
    assert yaml.safe_load(path.read_text())["all"]["vars"]["ansible_become"] is True
    assert "PermitRootLogin no\n" in hosts.sshd_config("debian")
    keys = hosts.authorized_keys("debian", "ssh-ed25519 AAAAkey tandem-lab\n")
    assert keys["debian"] == "ssh-ed25519 AAAAkey tandem-lab\n"
    assert keys["root"].startswith("no-port-forwarding,") and keys["root"].endswith(
        '"echo \'Please login as the user \\"debian\\" rather than the user \\"root\\".\';echo;exit 142" '
        "ssh-ed25519 AAAAkey tandem-lab\n")
    # the other shape: a provider that hands out root logins
    assert "PermitRootLogin prohibit-password\n" in hosts.sshd_config("root")
    assert hosts.authorized_keys("root", "k\n") == {"root": "k\n"}
    with pytest.raises(ValueError, match="log in as debian or root, not 'ubuntu'"):
        LabConfig(login_user="ubuntu")


def test_a_lab_saved_before_the_login_user_was_a_setting_is_read_as_a_root_login(tmp_path, monkeypatch):
    from lab import __main__ as cli

    monkeypatch.setattr(cli, "LabConfig", lambda **kw: LabConfig(state_root=tmp_path, **kw))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "lab.json").write_text('{"hosts": 2, "subnet": "10.78.0.0/24", "cluster_net": true}')
    assert cli.saved_config("old").login_user == "root"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_each_users_key_is_written_owned_by_that_user_without_hiding_the_rootfs_home(tmp_path, monkeypatch):
    """The upper layer's directories shadow the root filesystem's in the merged view: /home/debian made
    there as root's, or 0755 under a 0700 home, would lock its user out of ssh (StrictModes)."""
    lower = tmp_path / "rootfs"
    (lower / "etc").mkdir(parents=True)
    (lower / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                      "debian:x:1000:1000::/home/debian:/bin/bash\n")
    for home, uid, mode in (("root", 0, 0o700), ("home/debian", 1000, 0o700)):
        (lower / home).mkdir(parents=True)
        os.chown(lower / home, uid, uid)
        os.chmod(lower / home, mode)
    monkeypatch.setattr(rootfs, "rootfs_dir", lambda cache, distro: lower)
    upper = tmp_path / "upper"
    upper.mkdir()
    hosts.install_keys(LabConfig(), upper, "ssh-ed25519 AAAAkey tandem-lab\n")
    for path, owner, mode in (("home", 0, 0o755), ("home/debian", 1000, 0o700), ("home/debian/.ssh", 1000, 0o700),
                              ("home/debian/.ssh/authorized_keys", 1000, 0o600), ("root", 0, 0o700),
                              ("root/.ssh/authorized_keys", 0, 0o600)):
        st = (upper / path).stat()
        assert (st.st_uid, st.st_mode & 0o777) == (owner, mode), path



def test_ranks_2_gives_every_host_cpu_ranks_and_each_rank_its_share_of_the_cores(monkeypatch):
    """`make lab-up RANKS=2`: the inventory's cpu_ranks on every host, train_threads per rank (the machine's
    cores over every rank of every host, at least 1), and a lab of that shape told apart from one without."""
    from lab.__main__ import describe

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    cfg = LabConfig(ranks=2)
    rendered = yaml.safe_load(inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names}))
    hosts = rendered["all"]["children"]["cluster"]["hosts"]
    assert [hosts[n]["cpu_ranks"] for n in cfg.names] == [2, 2] and rendered["all"]["vars"]["train_threads"] == 2
    assert LabConfig().threads_per_rank == 4 and LabConfig(hosts=3, ranks=2).threads_per_rank == 1
    plain = yaml.safe_load(inventory.render(LabConfig(), {n: "/dev/loop0" for n in cfg.names}))
    assert all("cpu_ranks" not in h for h in plain["all"]["children"]["cluster"]["hosts"].values())
    assert describe(cfg) == "2 Debian bookworm hosts on 10.77.0.0/24, two networks, 2 ranks a host, login debian"
    with pytest.raises(ValueError, match="1 to 16 ranks"):
        LabConfig(ranks=0)
