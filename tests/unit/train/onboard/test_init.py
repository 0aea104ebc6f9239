"""`fab init` writes a newcomer's inventory (train/onboard/init.py): what it writes, what it refuses."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from train import hostvars
from train.cluster import ClusterError, GroupResult, Host, HostResult, load_hosts, parse_inventory
from train.errors import OptionError
from train.onboard import check, init
from train.onboard.init import render, write
from train.onboard.spec import Found, InventorySpec, NewHost, spec_from_options
from train.plan.link import nic_of

TOP = Path(__file__).resolve().parents[4]
FAB = str(Path(sys.executable).parent / "fab")


@pytest.fixture
def key(tmp_path) -> str:
    path = tmp_path / "id_ed25519"
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return str(path)


def test_the_written_inventory_is_what_fab_and_ansible_read(tmp_path, key):
    spec = spec_from_options("203.0.113.10,203.0.113.11", "ubuntu", key, "gpu1,gpu2", "10.0.0.10,10.0.0.11", "2",
                             "/dev/nvme1n1", "2.5")
    hosts = load_hosts(written := write(spec, tmp_path / "mine.yml"))
    assert [(h.name, h.address, h.cluster_address, h.user, h.key, h.gpus, h.data_device) for h in hosts] == [
        ("gpu1", "203.0.113.10", "10.0.0.10", "ubuntu", key, 2, "/dev/nvme1n1"),
        ("gpu2", "203.0.113.11", "10.0.0.11", "ubuntu", key, 2, "/dev/nvme1n1")]
    assert [h.var("hourly_usd") for h in hosts] == [2.5, 2.5]
    assert dict(parse_inventory(written))["gpu1"]["ansible_become"] is True  # Ansible's; fab keeps only its own


def test_vars_sets_any_of_tandems_host_variables_typed_for_every_host(tmp_path):
    spec = spec_from_options("203.0.113.10,203.0.113.11", "ubuntu",
                             vars="network_expected_mbps=25000,data_volume_min_free_gb=50")
    hosts = load_hosts(write(spec.with_found({}), tmp_path / "mine.yml"))
    assert [(h.var("network_expected_mbps"), h.var("data_volume_min_free_gb")) for h in hosts] == [(25000, 50.0)] * 2


def test_the_defaults_name_the_hosts_count_their_gpus_and_keep_data_on_the_root_disk(tmp_path):
    spec = spec_from_options("203.0.113.10, gpu-b.example.com", "debian").with_found({"gpu1": Found(gpus=2)})
    hosts = load_hosts(write(spec, tmp_path / "x.yml"))
    assert [(h.name, h.address, h.cluster_address, h.gpus, h.data_device, h.key) for h in hosts] == [
        ("gpu1", "203.0.113.10", "203.0.113.10", 2, "none", None),
        ("gpu2", "gpu-b.example.com", "gpu-b.example.com", 0, "none", None)]
    assert not hostvars.given(hosts[1], "gpus")  # gpu2 not asked: no `gpus:` written, never a guess
    assert [h.name for h in load_hosts(write(spec_from_options("203.0.113.10", "ubuntu", gpus="0"),
                                             tmp_path / "cpu.yml"))] == ["cpu1"]
    assert hosts[0].var("hourly_usd") is None  # no price given: none written, never guessed


def test_it_refuses_to_overwrite_an_inventory_unless_forced(tmp_path):
    path = tmp_path / "mine.yml"
    path.write_text("# mine, by hand\n")
    spec = InventorySpec((NewHost("gpu1", "203.0.113.10"),), "ubuntu", None)
    with pytest.raises(OptionError, match=r"^--out: inventory/mine.yml exists: give --force to overwrite it"):
        write(spec, path)
    assert path.read_text() == "# mine, by hand\n"
    write(spec, path, force=True)
    assert "gpu1:" in path.read_text()


def test_the_text_says_how_to_go_on():
    text = render(InventorySpec((NewHost("gpu1", "203.0.113.10"),), "ubuntu", "~/.ssh/id_ed25519"), "inventory/m.yml")
    assert "ansible-playbook -i inventory/m.yml provision.yml" in text
    assert "FABRIC_INVENTORY=inventory/m.yml fab init --check" in text
    assert "#   fab init --check" in render(InventorySpec((NewHost("gpu1", "203.0.113.10"),), "ubuntu"))  # fab's own
    assert "ansible_ssh_private_key_file: ~/.ssh/id_ed25519" in text  # as given: Ansible and fab expand ~


@pytest.mark.parametrize(("options", "said"), [
    ({"hosts_at": "203.0.113.300"}, "--hosts-at: '203.0.113.300' is not an IP address or a host name"),
    ({"hosts_at": "a b"}, "--hosts-at: 'a b' is not an IP address or a host name"),
    ({"hosts_at": "203.0.113.10,203.0.113.10"}, "--hosts-at: names an address twice"),
    ({"hosts_at": "203.0.113.10:22,203.0.113.10"}, "--hosts-at: names an address twice"),
    ({"hosts_at": "203.0.113.10:ssh"}, "--hosts-at: '203.0.113.10:ssh': the port after ':' must be"),
    ({"hosts_at": "203.0.113.10:70000"}, "--hosts-at: '203.0.113.10:70000': the port after ':' must be"),
    ({"port": "0"}, "--port: '0' is not a port"),
    ({"hosts_at": ""}, "--hosts-at: give the hosts' addresses"),
    ({"user": None}, "--user: give the hosts' login user"),
    ({"user": "Ubuntu User"}, "--user: 'Ubuntu User' is not a login name"),
    ({"key": "/no/such/key"}, "--key: no such key file: /no/such/key"),
    ({"names": "gpu1"}, "--names: gives 1 names for 2 hosts"),
    ({"names": "gpu1,cluster"}, "--names: 'cluster' cannot name a host"),
    ({"names": "a,a"}, "--names: names a host twice"),
    ({"cluster_at": "10.0.0.1"}, "--cluster-at: gives 1 addresses for 2 hosts"),
    ({"gpus": "two"}, "--gpus: 'two' is not a whole number"),
    ({"data_device": "sdb"}, "--data-device: 'sdb' is neither a block device"),
    ({"known_hosts": "/no/such/file"}, "--known-hosts: no such file: /no/such/file"),
    ({"hourly_usd": "cheap"}, "--hourly-usd: 'cheap' is not US dollars per hour"),
    ({"hourly_usd": "-1"}, "--hourly-usd: '-1' is not US dollars per hour (0 or more)"),
    ({"vars": "network_expected_mbps"}, "--vars: 'network_expected_mbps': expected NAME=VALUE"),
    ({"vars": "netwrk_expected_mbps=1000"}, "--vars: 'netwrk_expected_mbps' is not one of tandem's host variables"),
    ({"vars": "network_expected_mbps=fast"}, "--vars: network_expected_mbps must be"),
])
def test_a_bad_option_is_named_with_what_it_must_be(options, said):
    given = {"hosts_at": "203.0.113.10,203.0.113.11", "user": "ubuntu", **options}
    with pytest.raises(OptionError) as err:
        spec_from_options(**given)
    assert str(err.value).startswith(said)


def test_a_public_key_is_refused_naming_the_private_one(tmp_path):
    (tmp_path / "id.pub").write_text("ssh-ed25519 AAAA")
    with pytest.raises(OptionError, match=r"^--key: .*id.pub is a public key: give the private one \(.*/id\)"):
        spec_from_options("203.0.113.10", "ubuntu", str(tmp_path / "id.pub"))


def test_the_hosts_own_known_hosts_file_is_the_one_fab_and_ansible_check(tmp_path, key):
    known = tmp_path / "known_hosts"
    known.write_text("")
    spec = spec_from_options("203.0.113.10", "ubuntu", key, gpus="1", known_hosts=str(known))
    host = load_hosts(written := write(spec, tmp_path / "k.yml"))[0]
    assert host.known_hosts == str(known)
    assert dict(parse_inventory(written))[host.name]["ansible_ssh_common_args"] == f"-o UserKnownHostsFile={known}"


def answers(shown: dict[str, str]) -> GroupResult:
    """Each host's probe answer: {name: stdout}, or an error for a host that did not answer."""
    return GroupResult((name, HostResult(name, stdout=out, exited=0) if isinstance(out, str) else
                        HostResult(name, error=out)) for name, out in shown.items())


READY = "uid=1000\nos_id=debian\nos_version=12\nos_name=Debian 12\npython=3.11.2\nsmi=absent\npci_gpus={pci}\n" \
        "nics=lo eth0\naddress_local=yes\nroute=10.0.0.2 dev eth0 src 10.0.0.1\ndisk_path=/\ndisk_free_kb=90000000\n"
FIXTURES = TOP / "tests" / "fixtures" / "ip"


def vm(shape: str, pci: int = 0) -> str:
    """A host's probe answer, its `ip -j` outputs recorded on a VM of that shape (tests/fixtures/ip/); SSH reached
    its public address, which is on none of its NICs."""
    shown = {kind: (FIXTURES / f"{shape}.{kind}.json").read_text().strip() for kind in ("addr", "route")}
    nics = " ".join(link["ifname"] for link in json.loads(shown["addr"]))
    return READY.format(pci=pci).replace("address_local=yes\n", "").replace("nics=lo eth0", f"nics={nics}") + \
        f"ip_addr={shown['addr']}\nip_route={shown['route']}\n"


def test_fab_init_writes_where_the_peers_reach_each_host_and_bench_net_takes_its_nic(tmp_path, monkeypatch):
    """Two EC2 VMs reached at public addresses NAT'd onto them: each written with its private address and NIC."""
    monkeypatch.setattr(check, "ask", lambda hosts: answers({"gpu1": vm("aws-a", 1), "gpu2": vm("aws-b", 1)}))
    console = Console(record=True, width=300, soft_wrap=True)
    out = tmp_path / "mine.yml"
    code = init.init(console, None, out=str(out), hosts_at="203.0.113.10,203.0.113.11", user="debian")
    hosts = load_hosts(out)
    assert [(h.address, h.cluster_address, h.nic, h.gpus) for h in hosts] == [
        ("203.0.113.10", "172.31.5.10", "ens5", 1), ("203.0.113.11", "172.31.9.27", "ens5", 1)]
    assert [nic_of(h) for h in hosts] == ["ens5", "ens5"]  # fab bench-net's and bench-step's NIC
    said = console.export_text()
    assert code == 0, said
    assert "172.31.5.10 (ens5)" in said and "not on any of its NICs" not in said


def test_bench_nets_refusal_of_an_inventory_without_cluster_nic_says_the_fix():
    with pytest.raises(ClusterError, match=r"^gpu1: the inventory names no cluster_nic, the NIC tandem caps and "
                                           r"counts: set cluster_nic: NIC for gpu1 .*`fab init` writes it"):
        nic_of(Host("gpu1", "203.0.113.10"))


def test_cluster_at_gives_the_address_and_the_nic_is_the_one_holding_it(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "ask", lambda hosts: answers({"a": vm("lab-a"), "b": vm("lab-b")}))
    for given, nic in (("172.30.0.11,172.30.0.12", "ens5"), ("10.77.0.11,10.77.0.12", "eth0")):
        out = tmp_path / f"{nic}.yml"
        init.init(Console(file=io.StringIO()), None, out=str(out), hosts_at="10.77.0.11,10.77.0.12",
                            user="debian", names="a,b", cluster_at=given, gpus="0")
        assert [(h.cluster_address, h.nic) for h in load_hosts(out)] == [(a, nic) for a in given.split(",")]


def test_a_hosts_ssh_port_is_written_and_used(tmp_path):
    spec = spec_from_options("203.0.113.10:2222,[2001:db8::1]:2200,gpu-c.example.com", "ubuntu", port="2022",
                             gpus="1")
    assert [h.port for h in init.hosts_of(spec)] == [2222, 2200, 2022]  # the ones fab init asks
    hosts = load_hosts(write(spec, tmp_path / "p.yml"))
    assert [(h.address, h.port) for h in hosts] == [("203.0.113.10", 2222), ("2001:db8::1", 2200),
                                                    ("gpu-c.example.com", 2022)]
    hosts = load_hosts(write(spec_from_options("203.0.113.10:2222,203.0.113.10:2223", "ubuntu", gpus="1"),
                             tmp_path / "nat.yml"))  # one address, two machines behind its forwards
    assert [(h.name, h.port) for h in hosts] == [("gpu1", 2222), ("gpu2", 2223)]


def test_fab_init_writes_each_hosts_gpus_as_it_shows_them_and_checks_the_written_file(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(check, "ask", lambda hosts: asked.append([h.name for h in hosts]) or answers(
        {"a": READY.format(pci=2), "b": TimeoutError("timed out")}))
    console = Console(record=True, width=300, soft_wrap=True)
    out = tmp_path / "mine.yml"
    code = init.init(console, None, out=str(out), hosts_at="10.0.0.1,10.0.0.2", user="debian", names="a,b")
    assert asked == [["a", "b"]] and code == 1  # b did not answer
    hosts = load_hosts(out)
    assert [(h.name, h.gpus) for h in hosts] == [("a", 2), ("b", 0)]  # a: 2 on its PCI bus
    assert [hostvars.given(h, "gpus") for h in hosts] == [True, False]  # b: unknown, not a guessed `gpus: 1`
    assert ("# b did not answer: its gpus, cluster_nic unknown (no guess): run the same fab init with --force once it "
            "answers (fab init --check writes nothing)") in out.read_text()
    said = console.export_text()
    assert f"wrote {out}: 2 hosts" in said and "none (driver not installed yet: provisioning installs it); 2 on" in said
    assert "b: nothing answers SSH at debian@10.0.0.2 port 22 (timed out)" in said
    assert "the inventory gives no `gpus`" not in said  # one fix for a host that did not answer: the file's
    assert said.strip().splitlines()[-1] == ("1 problem(s) on b: fix them, then run the same fab init with --force: "
                                             "it writes what b shows once answering")
    assert "fab init --check" not in said.strip().splitlines()[-1]  # --check would never write b's gpus


def test_fab_init_refuses_an_existing_file_before_asking_a_host(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "ask", lambda hosts: pytest.fail("a host was asked"))
    (tmp_path / "mine.yml").write_text("# kept\n")
    with pytest.raises(OptionError, match="^--out: "):
        init.init(Console(), None, out=str(tmp_path / "mine.yml"), hosts_at="10.0.0.1", user="debian")
    with pytest.raises(OptionError, match="^--check: checks the inventory you have .*--hosts-at, --out write a new"):
        init.init(Console(), None, check=True, out="x.yml", hosts_at="10.0.0.1")


def test_a_cluster_that_passes_exits_0(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "ask", lambda hosts: answers({"cpu1": READY.format(pci=0)}))
    console = Console(record=True, width=300, soft_wrap=True)
    out = tmp_path / "mine.yml"
    assert init.init(console, None, out=str(out), hosts_at="10.0.0.1", user="debian", gpus="0") == 0
    assert "every host is ready: ansible-playbook -i" in console.export_text()
    assert [(h.name, h.gpus) for h in load_hosts(out)] == [("cpu1", 0)]


def test_written_where_fab_reads_unnamed_no_fabric_inventory_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "ask", lambda hosts: answers({"cpu1": READY.format(pci=0)}))
    monkeypatch.delenv("FABRIC_INVENTORY", raising=False)
    console = Console(record=True, width=300, soft_wrap=True)
    out = tmp_path / "mine.yml"  # fabric.yaml's `inventory` in this test
    assert init.init(console, str(out), out=str(out), hosts_at="10.0.0.1", user="debian", gpus="0") == 0
    assert console.export_text().strip().splitlines()[-1].endswith(" provision.yml, then fab info")
    assert "#   fab init --check" in out.read_text() and "FABRIC_INVENTORY" not in out.read_text()


def fab(*args: str, inventory: str = "inventory/hosts.yml") -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_INVENTORY": inventory, "COLUMNS": "200"}
    return subprocess.run([FAB, "init", *args], cwd=TOP, capture_output=True, text=True, timeout=120, env=env)


def test_fab_init_says_bad_input_in_one_line_and_exits_2_before_writing_or_reaching_a_host(tmp_path, key):
    out = tmp_path / "mine.yml"
    proc = fab("--hosts-at", "203.0.113.300", "--user", "ubuntu", "--out", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == "error: --hosts-at: '203.0.113.300' is not an IP address or a host name"
    out.write_text("# kept\n")
    proc = fab("--hosts-at", "203.0.113.10", "--user", "ubuntu", "--key", key, "--out", str(out))
    assert proc.returncode == 2 and out.read_text() == "# kept\n"
    assert proc.stderr.strip() == f"error: --out: {out} exists: give --force to overwrite it, or another --out"
    proc = fab("--hosts-at", "203.0.113.10", "--user", "ubuntu", "--out", str(tmp_path / "typo" / "mine.yml"))
    assert proc.returncode == 2 and not (tmp_path / "typo").exists()
    assert proc.stderr.strip() == (f"error: --out: {tmp_path}/typo/mine.yml: no directory {tmp_path}/typo: create it, "
                                   "or give another --out")
    proc = fab("--check", inventory=str(tmp_path / "none.yml"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: --check: inventory {tmp_path}/none.yml does not")
    assert "Traceback" not in proc.stdout + proc.stderr
