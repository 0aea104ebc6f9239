"""The link: tc's rates and commands, and what the hosts' answers to them turn into."""

from __future__ import annotations

import pytest

from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.plan import link

HOSTS = [Host("v100a", "10.0.0.1", nic="ens5"), Host("v100b", "10.0.0.2", nic="ens5")]  # root logins
# a cloud image's: its login user is not root
CLOUD = [Host("v100a", "10.0.0.1", user="debian", nic="ens5"), Host("v100b", "10.0.0.2", user="debian", nic="ens5")]


def test_rates_and_tc_commands():
    assert link.rate_bits("100mbit") == 100_000_000
    assert link.rate_bits("1gbit") == 10**9
    assert link.rate_bits("none") is None
    assert link.tbf_burst(10**9) == 625_000 and link.tbf_burst(10**7) == 16_384  # 5 ms, never below 16 kB
    with pytest.raises(ValueError):
        link.rate_bits("fast")
    assert link.cap_command("eth0", "100mbit", sudo=False) == (
        'PATH="$PATH:/usr/sbin:/sbin" tc qdisc replace dev eth0 root tbf rate 100000000bit burst 62500b latency 50ms')
    assert link.cap_command("eth0", "none", sudo=False) == (
        'PATH="$PATH:/usr/sbin:/sbin" tc qdisc del dev eth0 root 2>/dev/null; true')
    assert link.parse_caps("qdisc tbf 8001: root refcnt 2 rate 100Mbit burst 64Kb lat 50ms") == "100Mbit"
    assert link.parse_caps("qdisc noqueue 0: root refcnt 2") is None


def test_a_cap_and_its_removal_need_sudo_where_the_login_user_is_not_root():
    """Changing a qdisc needs CAP_NET_ADMIN: `sudo -n` (never a password prompt) for a cloud image's user;
    no cap to remove is fine, sudo refusing the removal is not (`sudo -n true` then fails, saying why).
    Reading the caps needs no root, but tc is in /sbin, off a Debian login user's PATH."""
    cap = link.cap_command("ens5", "100mbit", sudo=True)
    assert cap == ('PATH="$PATH:/usr/sbin:/sbin" sudo -n tc qdisc replace dev ens5 root tbf rate 100000000bit '
                   "burst 62500b latency 50ms")
    assert link.cap_command("ens5", "none", sudo=True) == (
        'PATH="$PATH:/usr/sbin:/sbin" sudo -n tc qdisc del dev ens5 root 2>/dev/null || sudo -n true')


def test_the_caps_go_through_sudo_only_for_a_login_user_who_is_not_root(monkeypatch):
    asked = []

    def run_each(hosts, commands):
        asked.append(commands)
        return group(**{h.name: (0, "qdisc noqueue 0:") for h in hosts})

    monkeypatch.setattr(link, "run_each", run_each)
    for hosts, sudo in ((CLOUD, True), (HOSTS, False)):
        asked.clear()
        link.apply_caps(hosts, "100mbit")
        assert link.remove_caps(hosts) == {"v100a": None, "v100b": None}
        cap, uncap, read = asked
        assert all(c.startswith(f'PATH="$PATH:/usr/sbin:/sbin" {"sudo -n " * sudo}tc qdisc replace dev ens5 root tbf')
                   for c in cap.values()), cap
        assert all(f"{'sudo -n ' * sudo}tc qdisc del dev ens5 root" in c for c in uncap.values()), uncap
        assert set(read.values()) == {'PATH="$PATH:/usr/sbin:/sbin" tc qdisc show dev ens5'}  # no root to read


def test_a_login_user_sudo_refuses_is_named_with_what_to_do_before_anything_changes(monkeypatch):
    """`sudo -n` asked on every host first (bench-step does, before it measures or starts anything); a
    host where it asks a password is named with the sudoers line that lets the user run tc."""
    asked = []

    def run_each(hosts, commands):
        asked.append(commands)
        return group(v100a=(0, ""), v100b=(1, "sudo: a password is required"))

    monkeypatch.setattr(link, "run_each", run_each)
    with pytest.raises(ClusterError) as refused:
        link.require_sudo(CLOUD)
    assert asked == [{"v100a": "sudo -n true", "v100b": "sudo -n true"}]
    assert str(refused.value) == (
        "capping the link needs root on every host (tc):\n  v100b: tc needs root, and `sudo -n` refused debian "
        "(sudo: a password is required): give debian passwordless sudo there, as cloud images do (a line "
        "`debian ALL=(ALL) NOPASSWD:ALL` in a file under /etc/sudoers.d/; tc alone is enough: "
        "`debian ALL=(root) NOPASSWD: /usr/sbin/tc`)")
    with pytest.raises(ClusterError, match=r"could not set the cap 100mbit \(tc\):\n  v100b: tc needs root, and "
                                           r"`sudo -n` refused debian"):
        link.apply_caps(CLOUD, "100mbit")
    with pytest.raises(ClusterError, match=r"could not remove the cap \(tc\):\n  v100b: tc needs root"):
        link.remove_caps(CLOUD)
    asked.clear()
    link.require_sudo(HOSTS)  # root logins: nothing to ask
    assert asked == []


def group(**outcomes) -> GroupResult:
    """{host: HostResult}: an exception for a host SSH lost, (exit, text) for a command's end."""
    out = GroupResult()
    for name, o in outcomes.items():
        if isinstance(o, Exception):
            out[name] = HostResult(name, error=o)
        else:
            out[name] = HostResult(name, stdout=o[1] if o[0] == 0 else "", stderr=o[1] if o[0] else "", exited=o[0])
    return out


def test_a_cap_a_host_refused_names_the_host_and_tcs_words(monkeypatch):
    monkeypatch.setattr(link, "run_each", lambda hosts, commands: group(
        v100a=(0, ""), v100b=(2, "RTNETLINK answers: Operation not permitted")))
    with pytest.raises(ClusterError, match=r"could not set the cap 100mbit \(tc\):\n  v100b: RTNETLINK answers: "
                                           r"Operation not permitted"):
        link.apply_caps(HOSTS, "100mbit")


def test_caps_are_read_back_and_a_host_out_of_reach_is_named(monkeypatch):
    monkeypatch.setattr(link, "run_each", lambda hosts, commands: group(
        v100a=(0, "qdisc tbf 8001: root refcnt 2 rate 100Mbit burst 64Kb lat 50ms"), v100b=(0, "qdisc noqueue 0:")))
    assert link.caps(HOSTS) == {"v100a": "100Mbit", "v100b": None}
    with pytest.raises(ClusterError, match=r"a cap is still there: v100a 100Mbit"):
        link.remove_caps(HOSTS)
    monkeypatch.setattr(link, "run_each", lambda hosts, commands: group(
        v100a=(0, ""), v100b=OSError("No route to host")))
    with pytest.raises(ClusterError, match=r"v100b: could not read its qdisc: unreachable \(No route to host\)"):
        link.caps(HOSTS)


def test_iperf3_servers_that_did_not_start_are_named_and_stopped_all_the_same(monkeypatch):
    asked = []

    def run_each(hosts, commands):
        asked.append(commands)
        if len(asked) == 1:  # the servers
            return group(v100a=(0, ""), v100b=(127, "sh: 1: iperf3: not found"))
        return group(**{h.name: (0, "") for h in hosts})

    monkeypatch.setattr(link, "run_each", run_each)
    with pytest.raises(ClusterError, match=r"iperf3 server did not start \(is iperf3 installed\? provision.yml "
                                           r"installs it\):\n  v100b: sh: 1: iperf3: not found"):
        link.iperf(HOSTS, "ring")
    assert len(asked) == 2 and all("pkill -F" in c for c in asked[1].values())  # the stop, in finally


def test_a_pair_whose_client_failed_keeps_why(monkeypatch):
    def run_each(hosts, commands):
        if any("--client" in c for c in commands.values()):
            return group(**{h.name: OSError("No route to host") for h in hosts})
        return group(**{h.name: (0, "") for h in hosts})

    monkeypatch.setattr(link, "run_each", run_each)
    pairs, raw = link.iperf(HOSTS, "all")
    assert raw["v100a->v100b"] == "unreachable (No route to host)"
    assert pairs[0].src == "v100a" and pairs[0].mbps is None and pairs[0].error
