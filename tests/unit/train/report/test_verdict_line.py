"""The report's network and GPU answers in the one line `fab watch` shows."""

from __future__ import annotations

from train.report.answers import Answer, verdict_line


def network(verdict: str, share: float | None, link: float | None = 1000.0, mean: float = 920.0) -> Answer:
    return Answer("network", "?", "", {"mean_share": share, "link_mbps": link, "mean_mbps": mean}, verdict)


def gpus(verdict: str, util: float | None = None) -> Answer:
    return Answer("gpus", "?", "", {"mean_util_percent": util} if util is not None else {}, verdict)


def test_network_bound_while_gpus_idle():
    assert (verdict_line(network("network-bound", 0.92), gpus("underused", 60.0))
            == "network-bound: NIC at 92% of the 1000 Mbit/s link while GPUs idle 40%")


def test_not_network_bound_gpus_busy():
    assert (verdict_line(network("not", 0.12), gpus("full", 97.0))
            == "not network-bound: NIC at 12% of the 1000 Mbit/s link · GPUs busy 97%")


def test_cpu_hosts_and_an_unknown_link():
    assert (verdict_line(network("unknown", None, None, 9.1), gpus("absent"))
            == "network: cannot tell: NIC at 9.1 Mbit/s, link rate unknown · no GPU (absent, not 0%)")
    assert verdict_line(network("bursts", 0.3), gpus("unknown")).startswith("network-bound in bursts: NIC at 30%")
