"""`fab init --from HOST` (train/onboard/follow.py): another laptop's inventory and cluster key from the cluster's
record provisioning leaves on every host (roles/network/tasks/cluster_record.yml, train/hosts/cluster_record.py);
and `fab init`'s example addresses and unanswered hosts said as every task says them (issue 56)."""

from __future__ import annotations

import importlib.util
import json
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from train.cluster import ClusterError, GroupResult, HostResult, load_hosts
from train.errors import OptionError
from train.hosts import cluster_record
from train.onboard import check, follow, init

TOP = Path(__file__).resolve().parents[4]
READY = "uid=1000\nos_id=debian\nos_version=12\nos_name=Debian 12\npython=3.11.2\nsmi=absent\npci_gpus=0\n" \
        "nics=lo ens5\naddress_local=yes\nroute=10.0.0.2 dev ens5 src 10.0.0.1\ndisk_path=/\ndisk_free_kb=90000000\n"


def keypair(tmp_path: Path, name: str) -> tuple[str, str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tandem cluster cluster", "-f",
                    str(tmp_path / name)], check=True)
    return (tmp_path / name).read_text(), (tmp_path / f"{name}.pub").read_text().strip()


def the_filter():
    path = TOP / "roles" / "network" / "filter_plugins" / "cluster_record.py"
    spec = importlib.util.spec_from_file_location("cluster_record_filter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["cluster_record"]


HOSTVARS = {  # Ansible's hostvars after roles/network on two hosts, as fab init wrote their inventory
    "v100a": {"ansible_host": "198.51.100.7", "ansible_user": "ubuntu", "ansible_ssh_private_key_file": "~/.ssh/a",
              "preflight_address": "10.0.0.10", "network_cluster_nic": "ens5", "gpus": 1, "data_device": "none",
              "hourly_usd": 2.48},
    "v100b": {"ansible_host": "198.51.100.8", "ansible_port": 2222, "ansible_user": "ubuntu",
              "preflight_address": "10.0.0.11", "network_cluster_nic": "ens6", "gpus": 2,
              "data_device": "/dev/nvme1n1", "hourly_usd": 2.48},
}


def test_provisioning_writes_the_record_every_host_holds():
    task = yaml.safe_load((TOP / "roles" / "network" / "tasks" / "cluster_record.yml").read_text())[0]
    assert task["ansible.builtin.copy"]["dest"].endswith("/cluster.json")
    assert "cluster_record(" in task["vars"]["_record"]
    main = (TOP / "roles" / "network" / "tasks" / "main.yml").read_text()
    assert "cluster_record.yml" in main


def fetched(monkeypatch, record: dict, private: str) -> list[str]:
    asked = []

    def run_all(hosts, command, **_):
        asked.append(command)
        out = json.dumps(record) if command.startswith("cat /etc/tandem/cluster.json") else private
        return GroupResult([(hosts[0].name, HostResult(hosts[0].name, stdout=out, exited=0))])

    monkeypatch.setattr(follow, "run_all", run_all)
    monkeypatch.setattr(check, "ask", lambda hosts: GroupResult((h.name, HostResult(h.name, stdout=READY, exited=0))
                                                                 for h in hosts))
    return asked


def test_fab_init_from_a_host_rebuilds_the_inventory_and_the_cluster_key(tmp_path, monkeypatch):
    private, public = keypair(tmp_path, "made")
    record = the_filter()(["v100a", "v100b"], HOSTVARS, "cluster", public)
    asked = fetched(monkeypatch, record, private)
    out = tmp_path / "inv" / "mine.yml"
    out.parent.mkdir()
    console = Console(record=True, width=300, soft_wrap=True)
    init.init(console, None, out=str(out), from_host="198.51.100.7", user="ubuntu")
    assert asked == ["cat /etc/tandem/cluster.json", "cat ~/.ssh/tandem_cluster"]  # the login user trains
    hosts = load_hosts(out)
    assert [(h.name, h.address, h.port, h.cluster_address, h.nic, h.gpus, h.data_device, h.var("hourly_usd"), h.key)
            for h in hosts] == [("v100a", "198.51.100.7", 22, "10.0.0.10", "ens5", 1, "none", 2.48, None),
                                ("v100b", "198.51.100.8", 2222, "10.0.0.11", "ens6", 2, "/dev/nvme1n1", 2.48, None)]
    key = out.parent / ".tandem_cluster_key"  # where roles/common looks: provisioning keeps the cluster's key
    assert key.read_text() == private and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (out.parent / ".tandem_cluster_key.pub").read_text().strip() == public
    said = console.export_text()
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "made.pub")], capture_output=True,
                                 text=True).stdout.split()[1]
    assert f"cluster key {fingerprint} (checked against the record's public half)" in said


def test_a_key_that_is_not_the_records_is_refused_and_nothing_written(tmp_path, monkeypatch):
    _, public = keypair(tmp_path, "made")
    other, _ = keypair(tmp_path, "other")
    fetched(monkeypatch, the_filter()(["v100a", "v100b"], HOSTVARS, "cluster", public), other)
    with pytest.raises(ClusterError, match=r"\.ssh/tandem_cluster is not the cluster key the record names \(SHA256:"):
        init.init(Console(), None, out=str(tmp_path / "mine.yml"), from_host="198.51.100.7", user="ubuntu")
    assert not (tmp_path / "mine.yml").exists() and not (tmp_path / ".tandem_cluster_key").exists()


def test_another_training_user_reads_the_key_through_sudo_and_another_clusters_key_is_kept(tmp_path, monkeypatch):
    private, public = keypair(tmp_path, "made")
    record = {**the_filter()(["v100a"], HOSTVARS, "cluster", public), "train_user": "tandem"}
    asked = fetched(monkeypatch, record, private)
    (tmp_path / ".tandem_cluster_key").write_text(keypair(tmp_path, "other")[0])
    with pytest.raises(OptionError, match=r"^--from: .*\.tandem_cluster_key holds another cluster key"):
        init.init(Console(), None, out=str(tmp_path / "mine.yml"), from_host="198.51.100.7", user="ubuntu")
    assert asked[-1] == "sudo -n cat ~tandem/.ssh/tandem_cluster"


def test_from_refuses_options_that_describe_the_hosts_and_a_missing_record_says_the_fix(tmp_path, monkeypatch):
    with pytest.raises(OptionError, match="^--from: reads the hosts from the cluster's record; --names describe"):
        init.init(Console(), None, out=str(tmp_path / "m.yml"), from_host="198.51.100.7", user="ubuntu", names="a")
    monkeypatch.setattr(follow, "run_all", lambda hosts, command, **_: GroupResult([(hosts[0].name, HostResult(
        hosts[0].name, stderr="cat: /etc/tandem/cluster.json: No such file or directory", exited=1))]))
    with pytest.raises(ClusterError, match="holds no cluster record .*ansible-playbook provision.yml"):
        init.init(Console(), None, out=str(tmp_path / "m.yml"), from_host="198.51.100.7", user="ubuntu")


def test_the_record_round_trips_and_its_fingerprint_is_ssh_keygens(tmp_path):
    private, public = keypair(tmp_path, "made")
    parsed = cluster_record.parse(json.dumps(the_filter()(["v100a", "v100b"], HOSTVARS, "cluster", public)))
    assert [h.name for h in parsed.hosts] == ["v100a", "v100b"] and parsed.user == parsed.train_user == "ubuntu"
    assert "ansible_ssh_private_key_file" not in json.dumps(cluster_record.record(["v100a"], HOSTVARS, "c", public))
    assert cluster_record.same_key(private, public)
    with pytest.raises(ValueError, match="not a cluster record"):
        cluster_record.parse('{"hosts": []}')


def test_the_readmes_example_addresses_are_refused_where_fab_reads_as_every_task_refuses_them(tmp_path, monkeypatch):
    monkeypatch.delenv("FABRIC_INVENTORY", raising=False)
    monkeypatch.setattr(check, "ask", lambda hosts: pytest.fail("a host was asked"))
    out = tmp_path / "mine.yml"
    with pytest.raises(OptionError, match=r"^--hosts-at: every host is at a documentation address \(gpu1 "
                                          r"203.0.113.10, gpu2 203.0.113.11\), the README's example"):
        init.init(Console(), str(out), out=str(out), hosts_at="203.0.113.10,203.0.113.11", user="ubuntu")
    assert not out.exists()
