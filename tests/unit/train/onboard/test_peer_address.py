"""Where a host's peers reach it (train/onboard/peer_address.py), from `ip -j addr show` and
`ip -j route show` as hosts of each shape print them (tests/fixtures/ip/: EC2 with its public address
NAT'd, GCE's /32s, a VM with a public and a private NIC and docker running, tandem's lab with its
cluster NIC and no default route)."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.onboard import peer_address
from train.onboard.peer_address import Side

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ip"


def shown(host: str) -> tuple[tuple[peer_address.Address, ...], tuple[peer_address.Route, ...]]:
    return (peer_address.addresses((FIXTURES / f"{host}.addr.json").read_text()),
            peer_address.routes((FIXTURES / f"{host}.route.json").read_text()))


def side(host: str, peers: list[tuple[str | None, str]]) -> Side | None:
    """`host`'s side toward `peers`: (the peer's fixture, None when it did not answer; its SSH address)."""
    own, table = shown(host)
    return peer_address.cluster_side(own, table, [(shown(p)[0] if p else (), ssh) for p, ssh in peers])


def test_addresses_are_the_ipv4_ones_of_nics_that_are_up_and_not_loopback():
    # docker0 is down (no container runs): not one
    assert [(a.nic, str(a.address), a.prefix) for a in shown("aws-a")[0]] == [("ens5", "172.31.5.10", 20)]
    assert [(a.nic, str(a.address)) for a in shown("two-a")[0]] == [
        ("eth0", "95.216.1.10"), ("enp7s0", "10.0.0.2"), ("docker0", "172.17.0.1")]


@pytest.mark.parametrize(("host", "peers", "expected"), [
    # EC2: SSH reaches the public address, on none of the VM's NICs; the peer's private one is on the same /20
    ("aws-a", [("aws-b", "203.0.113.11")], Side("ens5", "172.31.5.10")),
    ("aws-b", [("aws-a", "203.0.113.10")], Side("ens5", "172.31.9.27")),
    # GCE: a /32, the peer only through the gateway: still the NIC and address that route leaves from
    ("gcp-a", [("gcp-b", "34.70.0.3")], Side("ens4", "10.128.0.2")),
    # a public and a private NIC: the private network, not the default route's public NIC; docker0's 172.17.0.1,
    # on both hosts, is nobody's peer address
    ("two-a", [("two-b", "95.216.1.11")], Side("enp7s0", "10.0.0.2")),
    ("two-b", [("two-a", "95.216.1.10")], Side("enp7s0", "10.0.0.3")),
    # the lab: SSH on eth0's network, the cluster network on ens5 (the NIC the lab's own inventory names)
    ("lab-a", [("lab-b", "10.77.0.12")], Side("ens5", "172.30.0.11")),
    # a peer that did not answer: toward the address SSH reaches it at
    ("aws-a", [(None, "203.0.113.11")], Side("ens5", "172.31.5.10")),
    ("two-a", [(None, "95.216.1.11")], Side("eth0", "95.216.1.10")),
    ("lab-a", [(None, "10.77.0.12")], Side("eth0", "10.77.0.11")),
    # one host: its default route's
    ("two-a", [], Side("eth0", "95.216.1.10")),
])
def test_the_cluster_side_is_the_route_toward_the_peers_private_addresses(host, peers, expected):
    assert side(host, peers) == expected


def test_no_route_toward_the_peers_is_no_side_not_a_guess():
    assert side("lab-a", [(None, "192.168.5.5")]) is None  # the lab has no default route
    assert side("lab-a", []) is None  # nor a default route to take alone
    assert peer_address.cluster_side((), shown("aws-a")[1], [(None, "203.0.113.11")]) is None  # no `ip -j` answer


def test_an_answer_that_is_no_json_lists_nothing():
    assert peer_address.addresses("Object \"-j\" is unknown, try \"ip help\".") == ()
    assert peer_address.routes("") == ()


def test_the_kernels_route_is_the_longest_prefix_then_the_lowest_metric():
    table = peer_address.routes('[{"dst":"default","gateway":"10.0.0.1","dev":"a","metric":100},'
                           '{"dst":"default","gateway":"10.0.0.1","dev":"b","metric":50},'
                           '{"dst":"10.0.0.0/16","dev":"c"},{"type":"blackhole","dst":"10.0.5.0/24"}]')
    route = peer_address.route_to(table, peer_address.IPv4("10.0.5.1"))
    assert route is not None and route.dev == "c"  # the blackhole carries nothing
    route = peer_address.route_to(table, peer_address.IPv4("8.8.8.8"))
    assert route is not None and route.dev == "b"


def test_a_given_cluster_address_names_the_nic_that_holds_it():
    assert peer_address.nic_of(shown("lab-a")[0], "172.30.0.11") == "ens5"
    assert peer_address.nic_of(shown("aws-a")[0], "203.0.113.10") is None  # NAT'd: on none of its NICs
