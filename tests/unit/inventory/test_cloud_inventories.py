"""inventory/examples/{aws_ec2,gcp_compute}.yml as Ansible and fab read them, against recorded cloud answers.

No cloud is called: each example is parsed by its own plugin (amazon.aws.aws_ec2, google.cloud.gcp_compute)
with the recorded answer (tests/fixtures/cloud/) put in the plugin's cache first (replay.py), so that
the plugin's options, hostnames, compose, groups and keyed_groups run as they do for a user. The copy
under test differs from the example only in where its cache lives and that it never expires.

Why the cache and not the `constructed` plugin over a host list: the examples' expressions read the
plugins' own host variables (ec2_public_ip_address, networkInterfaces[0].natIP), which only the
plugins make from an API answer. Both plugins refuse to parse without their SDK importable (boto3;
google-auth, requests), even on a cache hit that never calls it: with inventory/examples/requirements.txt
installed this runs them exactly as a user does; without it, replay.py lifts that import check and
nothing else, so that the test runs wherever the unit tests do (replay.py says which on stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TOP = Path(__file__).resolve().parents[3]
REPLAY = Path(__file__).with_name("replay.py")
NO_PLUGIN = 77  # replay.py's exit status when the plugin's collection is not installed
ANSWERS = TOP / "tests" / "fixtures" / "cloud"

# per example: the recorded answer, and each host tandem should train on: (SSH address, cluster address,
# gpus, $/h or None, data_device); the answers also hold a VM not tagged for tandem (bastion, builder)
CASES = {
    "aws_ec2": ("aws_ec2_describe_instances.json", "bastion", {
        "gpu1": ("203.0.113.10", "172.31.20.10", 1, 3.06, "/dev/xvdf"),
        "gpu2": ("203.0.113.11", "172.31.20.11", 1, None, "none")}),
    "gcp_compute": ("gcp_compute_aggregated_instances.json", "builder", {
        "gpu1": ("198.51.100.20", "10.128.0.20", 1, 2.48, "/dev/sdb"),
        "gpu2": ("198.51.100.21", "10.128.0.21", 1, 2.48, "none")}),
}


def source(tmp_path: Path, name: str) -> Path:
    config = yaml.safe_load((TOP / "inventory" / "examples" / f"{name}.yml").read_text())
    config.update(cache=True, cache_connection=str(tmp_path / "cache"), cache_timeout=0)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def replay(mode: str, tmp_path: Path, name: str):
    answer = ANSWERS / CASES[name][0]
    proc = subprocess.run([sys.executable, str(REPLAY), mode, str(source(tmp_path, name)), str(answer)], cwd=TOP,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == NO_PLUGIN:  # a controller's venv: the tests' has the whole ansible release
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def plain(value):
    """ansible-inventory marks untrusted text {"__ansible_unsafe": text}."""
    return value.get("__ansible_unsafe", value) if isinstance(value, dict) else value


@pytest.mark.parametrize("name", CASES)
def test_the_example_puts_the_tagged_vms_in_the_cluster_group_with_tandems_variables(tmp_path, name):
    listed = replay("list", tmp_path, name)
    _, other, want = CASES[name]
    assert listed["cluster"]["hosts"] == list(want)  # rank order: the plugin's (instance ids, the API's)
    hostvars = listed["_meta"]["hostvars"]
    assert other in hostvars and other not in listed["cluster"]["hosts"]  # listed by the cloud, not trained on
    for host, (public, private, gpus, price, device) in want.items():
        got = {k: plain(hostvars[host].get(k)) for k in
               ("ansible_host", "cluster_address", "gpus", "hourly_usd", "data_device", "ansible_user")}
        assert got == {"ansible_host": public, "cluster_address": private, "gpus": gpus, "hourly_usd": price,
                       "data_device": device, "ansible_user": "ubuntu"}, host
        assert plain(hostvars[host]["stop_command"]).split()[:2] in (["aws", "ec2"], ["gcloud", "compute"])
    assert any(group.startswith("type_") for group in listed) and any(g.startswith("zone_") for g in listed)


@pytest.mark.parametrize("name", CASES)
def test_fab_resolves_the_examples_cluster(tmp_path, name):
    """train.cluster.load_hosts, as every fab task does: the collection's plugin found, the variables typed."""
    hosts = replay("tandem", tmp_path, name)
    want = CASES[name][2]
    assert [(h["name"], h["address"], h["cluster_address"], h["gpus"], h["hourly_usd"], h["data_device"])
            for h in hosts] == [(n, *v[:4], v[4]) for n, v in want.items()]
    assert all(h["user"] == "ubuntu" and h["key"].startswith("~/.ssh/") for h in hosts)
