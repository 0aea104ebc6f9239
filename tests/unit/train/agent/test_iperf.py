"""iperf3's command lines and its JSON: the one parser both provisioning and the benchmarks use."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from train.agent import iperf


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


@pytest.mark.skipif(not shutil.which("iperf3"), reason="iperf3 is not installed (make setup installs it)")
def test_the_commands_measure_over_loopback(tmp_path):
    """The server and client lines as the hosts run them, against this machine's loopback."""
    pidfile = str(tmp_path / "iperf3.pid")
    port = 5299
    subprocess.run(iperf.server_command(port, pidfile, "127.0.0.1") + " && sleep 0.3", shell=True, check=True)
    try:
        out = subprocess.run(iperf.client_command("127.0.0.1", port, seconds=1, omit=0), shell=True,
                             capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run(iperf.stop_command(pidfile), shell=True, check=True)
    pair = iperf.parse("lo", "lo", out.stdout, out.stderr)
    assert pair.error is None and pair.mbps > 100, out.stdout[-500:]
    again = iperf.parse("lo", "lo", *_run(iperf.client_command("127.0.0.1", port, seconds=1)))
    assert again.mbps is None and "connect" in again.error  # the server is gone: named, not 0 silently


def _run(command: str) -> tuple[str, str]:
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30)
    return proc.stdout, proc.stderr
