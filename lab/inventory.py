"""The lab's Ansible inventory: the same shape a real cluster's inventory has."""

from __future__ import annotations

import yaml

from lab.config import CLUSTER_NIC, LabConfig


def render(cfg: LabConfig, data_devices: dict[str, str]) -> str:
    ssh_args = f"-o UserKnownHostsFile={cfg.known_hosts} -o StrictHostKeyChecking=yes"
    hosts = {
        name: {
            "ansible_host": cfg.host_ip(name),
            "gpus": 0,
            "cluster_nic": "eth0",
            "data_device": data_devices[name],
        }
        for name in cfg.names
    }
    if cfg.cluster_net:  # SSH on eth0's address, everything host to host on ens5's
        for name in cfg.names:
            hosts[name].update(cluster_address=cfg.cluster_ip(name), cluster_nic=CLUSTER_NIC)
    for name in cfg.slow_nic_hosts:
        # eth1 reports 100 Mb/s (and carries no traffic): as the cluster NIC it is a VM's 100 Mb/s port,
        # and provisioning must stop at it, naming the host and the speed.
        hosts[name]["cluster_nic"] = "eth1"
    if cfg.ranks > 1:  # `make lab-up RANKS=2`: several ranks a host, the path multi-GPU hosts take
        for name in cfg.names:
            hosts[name]["cpu_ranks"] = cfg.ranks
    inventory = {
        "all": {
            "vars": {
                # As on a cloud image: a login user with passwordless sudo (root may not log in), and
                # become, as in inventory/hosts.yml; `--login-user root` gives the root-login shape.
                "ansible_user": cfg.login_user,
                "ansible_become": True,
                "ansible_ssh_private_key_file": str(cfg.key),
                "ansible_ssh_common_args": ssh_args,
                "tandem_known_hosts_file": str(cfg.known_hosts),
                # A veth pair between namespaces: no physical NIC speed to expect.
                "network_expected_mbps": 1000,
                # The hosts have no route off this machine: packages come from the lab.
                "train_env_wheelhouse_url": f"{cfg.repo_url}/wheels/",
                # torch's build in the wheelhouse for the hosts' Python (lab/config.py DISTROS)
                "train_env_accelerator": cfg.accelerator,
                "tandem_lab": True,
                # The hosts share this machine's cores: every rank on its share of them (unset, torch
                # would start a thread per core in every rank and they would contend).
                "train_threads": cfg.threads_per_rank,
            },
            "children": {"cluster": {"hosts": hosts}},
        }
    }
    header = (
        f"# The tandem lab ({cfg.hosts} Debian {cfg.distro} hosts on {cfg.subnet}"
        + (f", {cfg.ranks} ranks each" if cfg.ranks > 1 else "")
        + f", login {cfg.login_user}), written by `make lab-up`.\n"
        "# It describes the lab exactly as a real cluster's inventory would: see inventory/hosts.yml.\n"
    )
    return header + yaml.safe_dump(inventory, sort_keys=False)
