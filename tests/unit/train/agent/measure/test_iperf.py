"""iperf3's command lines and its JSON: the one parser both provisioning and the benchmarks use."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from train.agent.measure import iperf


def test_iperf_json_gives_the_receivers_rate():
    text = json.dumps({"end": {"sum_sent": {"bits_per_second": 9.6e7, "retransmits": 3},
                               "sum_received": {"bits_per_second": 9.56e7}}})
    p = iperf.parse("a", "b", text)
    assert (p.mbps, p.retransmits, p.error) == (95.6, 3, None)
    assert iperf.link_mbps([p, iperf.Pair("b", "a", 120.0)]) == 95.6


def test_a_failed_pair_says_why_and_reports_zero_to_provisioning():
    refused = iperf.parse("a", "b", json.dumps({"error": "unable to connect to server"}))
    assert refused.mbps is None and refused.error == "unable to connect to server"
    assert refused.figures() == {"src": "a", "dst": "b", "mbps": 0.0, "retransmits": 0,
                                 "error": "unable to connect to server"}
    unreachable = iperf.parse("a", "b", "", "ssh: connect to host 10.0.0.2 port 22: No route to host")
    assert unreachable.mbps is None and "No route to host" in unreachable.error
    assert iperf.parse("a", "b", "{}").error == "iperf3 reported no rate"


def test_pairs():
    assert iperf.ordered_pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "a"), ("b", "c"), ("c", "a"),
                                                    ("c", "b")]
    assert iperf.ordered_pairs(["a", "b", "c"], "ring") == [("a", "b"), ("b", "c"), ("c", "a")]
    assert iperf.ordered_pairs(["a", "b"], "ring") == [("a", "b"), ("b", "a")]
    assert iperf.ordered_pairs(["a"]) == []


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed (make test-setup installs it)")
def test_the_commands_measure_over_loopback(tmp_path):
    """The server and client lines as the hosts run them, against this machine's loopback."""
    pidfile = str(tmp_path / "iperf3.pid")
    port = 5299
    subprocess.run(iperf.server_command(port, pidfile, "127.0.0.1"), shell=True, check=True)
    try:
        out = subprocess.run(iperf.client_command("127.0.0.1", port, seconds=1, omit=0), shell=True,
                             capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run(iperf.stop_command(pidfile), shell=True, check=True)
    pair = iperf.parse("lo", "lo", out.stdout, out.stderr)
    assert pair.error is None and pair.mbps > 100, out.stdout[-500:]
    again = iperf.parse("lo", "lo", *_run(iperf.client_command("127.0.0.1", port, seconds=1)))
    assert again.mbps is None and "connect" in again.error  # the server is gone: named, not 0 silently
    assert iperf.unreachable([again, pair]) == [again]  # fab train stops on it rather than hang at rendezvous


def test_fast_links_are_measured_with_parallel_streams():
    assert [iperf.streams_for(m) for m in (None, 100, 1000, 9999, 10000, 25000, 40000, 100000, 400000)] == \
        [1, 1, 1, 1, 4, 5, 8, 16, 16]
    assert iperf.streams("auto", 25000) == 5 and iperf.streams(None, 25000) == 5 and iperf.streams("3", 100) == 3
    assert "--parallel" not in iperf.client_command("10.0.0.2", streams=1)
    assert " --parallel 4 " in iperf.client_command("10.0.0.2", streams=4)


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed (make test-setup installs it)")
def test_parallel_streams_are_reported_as_their_sum(tmp_path):
    pidfile, port = str(tmp_path / "iperf3.pid"), 5297
    subprocess.run(iperf.server_command(port, pidfile, "127.0.0.1"), shell=True, check=True)
    try:
        stdout, stderr = _run(iperf.client_command("127.0.0.1", port, seconds=1, omit=0, streams=4))
    finally:
        subprocess.run(iperf.stop_command(pidfile), shell=True, check=True)
    data = json.loads(stdout)
    assert data["start"]["test_start"]["num_streams"] == 4, stderr
    each = [s["receiver"]["bits_per_second"] for s in data["end"]["streams"]]
    pair = iperf.parse("lo", "lo", stdout, stderr)
    assert len(each) == 4 and pair.mbps == pytest.approx(sum(each) / 1e6, rel=0.01)
    assert pair.mbps > 1.5 * max(each) / 1e6  # the sum, not one stream's share


def _run(command: str) -> tuple[str, str]:
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
    return proc.stdout, proc.stderr


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed (make test-setup installs it)")
def test_the_server_binds_to_the_cluster_address_only_where_the_host_has_it(tmp_path):
    """A cloud VM's public address is NAT'd, not on its NIC: the server must still listen (on every
    address) rather than die behind --daemon; an address the host has is bound to, alone."""
    pidfile, port = str(tmp_path / "iperf3.pid"), 5298
    for bind, listens_on in [("203.0.113.7", "*"), ("127.0.0.1", "127.0.0.1")]:  # TEST-NET-3: never local
        started = subprocess.run(iperf.server_command(port, pidfile, bind), shell=True, capture_output=True,
                                 text=True, timeout=30)
        try:
            assert started.returncode == 0, started.stderr
            sockets = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
            assert f"{listens_on}:{port}" in sockets.replace("0.0.0.0", "*"), sockets
            pair = iperf.parse("lo", "lo", *_run(iperf.client_command("127.0.0.1", port, seconds=1, omit=0)))
            assert pair.error is None and pair.mbps > 100
        finally:
            subprocess.run(iperf.stop_command(pidfile), shell=True, check=True)
