"""The link between the hosts: iperf3 between them, and tc caps on their cluster NICs.

Everything here runs on the hosts over ssh (train.cluster.run_each, in parallel). The pure
parts are separate so the unit tests cover them without a cluster: tc's rates and commands
here, iperf3's command lines, its JSON parser and which pairs to measure in train.agent.measure.iperf
(the network role measures with the same).

- iperf3: a server on every host (`--daemon`, pid file /tmp/tandem-bench-iperf3-USER.pid, stopped
  by that pid afterwards, also on errors), then the client on the sender of each pair.
  `pairs="all"` measures every ordered pair one after the other (bench-net); `pairs="ring"`
  measures host i → host i+1 for every i at once: exactly the traffic of a ring all-reduce,
  in one round (the quick check `fab train` and `fab bench-step` do).
- tc: `tc qdisc replace dev NIC root tbf rate R burst B latency 50ms` on every host's
  egress (as the lab's `shape`, lab/network.py); `remove_caps` deletes the root qdisc and
  then reads `tc qdisc show` back to confirm no tbf is left. Changing a qdisc needs root
  (CAP_NET_ADMIN): on a host whose login user is not root (a cloud image's `ubuntu`, `debian`,
  `ec2-user`) the cap and its removal run through `sudo -n`, which fails at once, never asks for a
  password; `require_sudo` asks every host before anything changes. Reading a qdisc needs no root.
"""

from __future__ import annotations

import shlex

from train.agent.measure import iperf as iperf3
from train.agent.measure.iperf import Pair, link_mbps, ordered_pairs
from train.cluster import ClusterError, GroupResult, Host, run_each
from train.reachability import require_answered

__all__ = ["Pair", "link_mbps", "ordered_pairs"]  # the pair figures, for benchmarks.net and predict


def iperf_pidfile(host: Host) -> str:
    """Where the benchmark's iperf3 server keeps its pid on `host`: Fabric runs as the inventory's
    user (ubuntu on a cloud image, not root), who cannot write /run; one file per user."""
    return f"/tmp/tandem-bench-iperf3-{host.user}.pid"


RATE_UNITS = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}


class PeerUnreachable(ClusterError):
    """A host cannot connect to a peer's cluster address on a port provisioning opened between
    them: torchrun's rendezvous would hang there, so `fab train` stops instead of starting."""


def require_reachable(pairs: list[Pair], hosts: list[Host]) -> None:
    by_name = {h.name: h for h in hosts}
    lost = iperf3.unreachable(pairs)
    if lost:
        raise PeerUnreachable("the cluster network does not connect, nothing started:\n  " + "\n  ".join(
            f"{p.src} cannot reach {p.dst} at {by_name[p.dst].cluster_address} (iperf3: {p.error})" for p in lost)
            + "\n  check the cluster NIC and address on those hosts (`ip addr`), and the firewall between them")


def rate_bits(rate: str) -> int | None:
    """'100mbit' -> 100_000_000 (tc's decimal units); 'none' -> None (no cap)."""
    text = rate.strip().lower()
    if text in ("none", "", "off"):
        return None
    for unit, factor in RATE_UNITS.items():
        if text.endswith(unit):
            try:
                value = float(text[: -len(unit)])
            except ValueError:
                break
            if value > 0:
                return int(value * factor)
    raise ValueError(f"rate {rate!r} is not a tc rate like 10mbit, 100mbit, 1gbit or none")


def tbf_burst(bits_per_s: int) -> int:
    """Bucket bytes: 5 ms of traffic, at least 16 kB (as the lab: 62.5 kB at 100mbit)."""
    return max(bits_per_s // 8 // 200, 16 * 1024)


# tc lives in /sbin, which a login user's PATH lacks on Debian (sshd gives users /usr/local/bin:/usr/bin:/bin).
SBIN_PATH = 'PATH="$PATH:/usr/sbin:/sbin"'
# sudo's own words when it will not run a command for the user (no sudo, or a password needed)
SUDO_REFUSED = ("sudo: a password is required", "sudo: a terminal is required", "is not in the sudoers file",
                "is not allowed to execute", "sudo: not found", "sudo: command not found", "may not run sudo")


def needs_sudo(host: Host) -> bool:
    """Whether changing `host`'s qdisc goes through sudo: its login user is not root."""
    return host.user != "root"


def sudo_advice(host: Host, why: str) -> str:
    """`host: ...`: sudo refused the login user, and what to do about it."""
    return (f"{host.name}: tc needs root, and `sudo -n` refused {host.user} ({why.strip()}): give {host.user} "
            f"passwordless sudo there, as cloud images do (a line `{host.user} ALL=(ALL) NOPASSWD:ALL` in a file "
            f"under /etc/sudoers.d/; tc alone is enough: `{host.user} ALL=(root) NOPASSWD: /usr/sbin/tc`)")


def refused_by_sudo(why: str) -> bool:
    return any(words in why for words in SUDO_REFUSED)


def require_sudo(hosts: list[Host]) -> None:
    """Every host whose login user is not root may run tc as root without a password; raises naming
    each host that may not, with what to do, before anything changed."""
    asking = [h for h in hosts if needs_sudo(h)]
    if not asking:
        return
    answers = run_each(asking, {h.name: "sudo -n true" for h in asking})
    require_answered(asking, answers)  # a silent host is unreachable, not one where sudo refused
    failed = _failures(asking, answers)
    if failed:
        raise ClusterError("capping the link needs root on every host (tc):\n  " + "\n  ".join(failed))


def nic_of(host: Host) -> str:
    if not host.nic:
        raise ClusterError(f"{host.name}: the inventory names no cluster_nic, the NIC tandem caps and counts: set "
                           f"cluster_nic: NIC for {host.name} (the `dev` of `ip route get PEER` there, PEER another "
                           "host's cluster address; `fab init` writes it, `fab init --check` shows it)")
    return host.nic


def cap_command(nic: str, rate: str, *, sudo: bool) -> str:
    """The tc line that caps (or, for 'none', uncaps) `nic`'s egress; `sudo`: as root through `sudo -n`
    (a host's non-root login user), else as is (root: the lab's `shape` through `ip netns exec`).
    Uncapping a NIC that has no cap is no error; sudo refusing it is (`sudo -n true` says why)."""
    tc = f"{SBIN_PATH} sudo -n tc" if sudo else f"{SBIN_PATH} tc"
    bits = rate_bits(rate)
    if bits is None:
        return f"{tc} qdisc del dev {shlex.quote(nic)} root 2>/dev/null" + (" || sudo -n true" if sudo else "; true")
    return (f"{tc} qdisc replace dev {shlex.quote(nic)} root tbf rate {bits}bit burst {tbf_burst(bits)}b "
            "latency 50ms")


def host_cap_command(host: Host, rate: str) -> str:
    return cap_command(nic_of(host), rate, sudo=needs_sudo(host))


def _refused(hosts: list[Host], answers: GroupResult) -> dict[str, str]:
    """{host: what to do} for each host where sudo refused the command."""
    return {h.name: sudo_advice(h, answers[h.name].why) for h in hosts
            if answers[h.name].reachable and not answers[h.name].ok and refused_by_sudo(answers[h.name].why)}


def _failures(hosts: list[Host], answers: GroupResult) -> list[str]:
    """`host: why` for each host that failed; where sudo refused, what to do."""
    refused = _refused(hosts, answers)
    return [refused.get(name, f"{name}: {r.why}") for name, r in answers.failed.items()]


def parse_caps(tc_show: str) -> str | None:
    """The tbf rate in `tc qdisc show` output ('100Mbit'), or None when there is no tbf."""
    for line in tc_show.splitlines():
        if " tbf " in f" {line} " and " rate " in line:
            return line.split(" rate ")[1].split()[0]
    return None


def apply_caps(hosts: list[Host], rate: str) -> None:
    """Cap (or uncap, rate 'none') every host's cluster NIC; raises naming the hosts that failed."""
    failed = _failures(hosts, run_each(hosts, {h.name: host_cap_command(h, rate) for h in hosts}))
    if failed:
        raise ClusterError(f"could not set the cap {rate} (tc):\n  " + "\n  ".join(failed))


def caps(hosts: list[Host]) -> dict[str, str | None]:
    """The tbf rate on every host's cluster NIC now (None: no cap). Raises for unreachable hosts."""
    answers = run_each(hosts, {h.name: f"{SBIN_PATH} tc qdisc show dev {shlex.quote(nic_of(h))}" for h in hosts})
    out = {}
    for name, result in answers.items():
        if not result.ok:
            raise ClusterError(f"{name}: could not read its qdisc: {result.why}")
        out[name] = parse_caps(result.stdout)
    return out


def remove_caps(hosts: list[Host]) -> dict[str, str | None]:
    """Remove every cap and confirm it: {host: None} when clean; raises naming a host that kept one
    (and, where sudo refused the removal, what to do)."""
    answers = run_each(hosts, {h.name: host_cap_command(h, "none") for h in hosts})
    refused = _refused(hosts, answers)
    if refused:
        raise ClusterError("could not remove the cap (tc):\n  " + "\n  ".join(refused.values()))
    left = caps(hosts)
    kept = {n: r for n, r in left.items() if r}
    if kept:
        raise ClusterError("a cap is still there: " + ", ".join(f"{n} {r}" for n, r in kept.items()))
    return left


# ---- iperf3 (commands and parser: train.agent.measure.iperf, shared with roles/network) ----

def client_commands(batch: list[tuple[str, str]], by_name: dict[str, Host], port: int, seconds: float,
                    omit: int) -> dict[str, str]:
    """{sender: its iperf3 client line} for pairs (sender, receiver): to the receiver's cluster
    address, the one training uses (its ssh address may be a public one the firewall drops), with
    parallel streams where the sender's expected link calls for them (as provisioning measures)."""
    def streams(h: Host) -> int:
        return iperf3.streams(h.var("network_iperf_streams"), h.var("network_expected_mbps"))

    return {a: iperf3.client_command(by_name[b].cluster_address, port, seconds, omit, streams(by_name[a]))
            for a, b in batch}


def iperf(hosts: list[Host], pattern: str = "all", seconds: float = 3, omit: int = 1,
          port: int = iperf3.PORT) -> tuple[list[Pair], dict[str, str]]:
    """Measure the pairs; returns (pairs, {pair: raw JSON}). The servers are always stopped."""
    by_name = {h.name: h for h in hosts}
    names = [h.name for h in hosts]
    raw: dict[str, str] = {}
    pairs: list[Pair] = []
    # a server a failed run left behind is stopped first; each listens on its cluster address
    start = {h.name: f"{iperf3.stop_command(iperf_pidfile(h))}; "
                     f"{iperf3.server_command(port, iperf_pidfile(h), h.cluster_address)}" for h in hosts}
    try:
        bad = run_each(hosts, start).problems()
        if bad:
            raise ClusterError("iperf3 server did not start (is iperf3 installed? provision.yml installs it):\n  "
                               + "\n  ".join(bad))

        todo = ordered_pairs(names, pattern)
        rounds = [todo] if pattern == "ring" else [[p] for p in todo]
        for batch in rounds:
            senders = [by_name[a] for a, _ in batch]
            commands = client_commands(batch, by_name, port, seconds, omit)
            answers = run_each(senders, commands)
            for a, b in batch:
                result = answers[a]
                text = result.stdout or result.why
                raw[f"{a}->{b}"] = text
                pairs.append(iperf3.parse(a, b, text))
    finally:
        run_each(hosts, {h.name: iperf3.stop_command(iperf_pidfile(h)) for h in hosts})
    return pairs, raw
