"""Run a cloud inventory source against a recorded cloud answer, with no cloud access:

    python replay.py list   SOURCE ANSWER.json     ansible-inventory -i SOURCE --list
    python replay.py tandem SOURCE ANSWER.json     the hosts tandem's fab resolves (train.cluster.load_hosts)

The inventory plugins cache their cloud answer (`cache: true`): before parsing, the recorded answer
is stored in SOURCE's cache (its cache_connection, under the key the plugin computes for SOURCE's
path), shaped as the plugin stores it, so the plugin's own parse (options, cache read, hostnames,
compose, groups, keyed_groups) runs and never calls the cloud:

    amazon.aws.aws_ec2          `aws ec2 describe-instances` (Reservations) -> {"aws_ec2": instances by id},
                                as its _query returns them
    google.cloud.gcp_compute    the aggregatedList REST answer ({"items": {"zones/Z": {"instances": ...}}})
                                -> {project: {zone: instances}}, converted by the plugin's GcpInstance

Both plugins refuse to parse without their SDK importable (boto3; google-auth and requests), even
though a cache hit never calls it. With inventory/examples/requirements.txt installed this runs them as
a user does; without it, it lifts those import checks and nothing else (see lift_sdk_checks).
Run in a subprocess of its own: it installs Ansible's collection loader and patches plugin modules.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import yaml

NO_PLUGIN = 77  # exit status: the plugin's collection is not installed (the test skips)


def has(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:  # google.auth without google
        return False


def lift_sdk_checks() -> list[str]:
    """Where a plugin's SDK is missing, let its parse go on: the checks only ask whether the SDK
    imports; with the answer in the cache, no SDK function is called. Returns what was lifted."""
    lifted = []
    if not has("boto3", "botocore"):
        from ansible_collections.amazon.aws.plugins.plugin_utils import inventory as aws

        aws.AWSInventoryBase.require_aws_sdk = lambda self, **versions: True
        lifted.append("amazon.aws: boto3/botocore")
    if not has("google.auth", "requests"):
        from ansible_collections.google.cloud.plugins.inventory import gcp_compute
        from ansible_collections.google.cloud.plugins.module_utils import gcp_utils

        gcp_utils.HAS_GOOGLE_LIBRARIES = gcp_utils.HAS_REQUESTS = gcp_compute.HAS_GOOGLE_LIBRARIES = True
        lifted.append("google.cloud: google-auth/requests")
    return lifted


def cached_form(plugin_name: str, config: dict, answer: dict) -> object:
    """The recorded answer as the plugin stores it in its cache."""
    if plugin_name == "amazon.aws.aws_ec2":
        instances = [i for r in answer["Reservations"] for i in r["Instances"]]
        return {"aws_ec2": sorted(instances, key=lambda i: i["InstanceId"])}
    if plugin_name == "google.cloud.gcp_compute":
        from ansible_collections.google.cloud.plugins.inventory.gcp_compute import GcpInstance, InventoryModule

        zones = InventoryModule.build_list(None, [answer["items"]])
        for instances in zones.values():
            for instance in instances:  # the plugin caches them converted, as _add_hosts leaves them
                GcpInstance(instance, ["name"], None, True, config.get("name_suffix", ""))
        return {config["projects"][0]: {key[len("zones/"):]: instances for key, instances in zones.items()}}
    raise SystemExit(f"no recorded-answer shape for {plugin_name}")


def record(source: Path, answer: dict) -> None:
    """Store `answer` where the plugin SOURCE names will look for it first."""
    from ansible.plugins.loader import cache_loader, inventory_loader

    config = yaml.safe_load(source.read_text())
    plugin = inventory_loader.get(config["plugin"])
    if plugin is None:
        print(f"no {config['plugin']} plugin here: `ansible-galaxy collection install -r "
              "inventory/examples/requirements.yml` installs its collection", file=sys.stderr)
        sys.exit(NO_PLUGIN)
    key = plugin.get_cache_key(str(source))  # the path ansible-inventory passes: absolute, normalized
    cache = cache_loader.get(config.get("cache_plugin", "ansible.builtin.jsonfile"),
                             _uri=config["cache_connection"], _prefix=config.get("cache_prefix", "ansible_inventory_"),
                             _timeout=0)
    cache.set(key, cached_form(config["plugin"], config, answer))


def main() -> None:
    mode, source, answer = sys.argv[1], Path(sys.argv[2]).resolve(), json.loads(Path(sys.argv[3]).read_text())
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()
    warnings.filterwarnings("ignore", "AnsibleCollectionFinder has already been configured")  # the CLI's own call
    record(source, answer)
    lifted = lift_sdk_checks()
    print(json.dumps({"lifted": lifted}), file=sys.stderr)
    if mode == "list":
        from ansible.cli.inventory import InventoryCLI

        InventoryCLI(["ansible-inventory", "-i", str(source), "--list"]).run()
    else:
        from train.cluster import load_hosts

        print(json.dumps([{"name": h.name, "address": h.address, "cluster_address": h.cluster_address,
                           "user": h.user, "key": h.key, "gpus": h.gpus, "data_device": h.data_device,
                           "hourly_usd": h.var("hourly_usd"), "stop_command": h.var("stop_command")}
                          for h in load_hosts(source)]))


if __name__ == "__main__":
    main()
