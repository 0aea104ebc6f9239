"""bench-step on 2 hosts x 2 ranks (tests/conftest.py's two_by_two): the cost model with
n = 4 ranks on 2 hosts. A ring over ranks numbered host by host crosses each host's NIC once, so every
NIC carries 2(n-1)/n = 1.5 gradients an update (1.0 with one rank a host), and the step is predicted
from that. A speed target (`make bench-targets`, not `make test`)."""

from __future__ import annotations

import json
import statistics

import pytest
from labtools import TOP, fab

BENCH = TOP / "reports" / "bench"


@pytest.fixture(scope="module")
def sweep_2x2(two_by_two):
    fab(two_by_two, "bench-step", "--rates", "10mbit,100mbit,none", "--updates", "6", "--cycles", "3", timeout=1200)
    return json.loads((BENCH / "step-latest.json").read_text())


@pytest.mark.sweep
def test_two_by_two_ranks_nic_bytes_and_step_time_match_the_model(sweep_2x2):
    report = sweep_2x2
    assert report["ranks"] == 4 and report["n_hosts"] == 2 and report["compute_from"] == "none"
    for p in report["points"]:
        assert p["devices"] == 4, p  # every rank of both hosts took part
        nic = p["tx_per_update"] / p["model_tx_bytes"]
        print(f"2x2 {p['rate']}: NIC {p['tx_per_update'] / 1e6:.2f} MB per update against the model's "
              f"{p['model_tx_bytes'] / 1e6:.2f} MB ({nic:.2f}x)")
        assert 0.85 <= nic <= 1.15, p  # 1.5 gradients a NIC, not 1.0 (one rank a host) nor 3.0 (per rank)
        if p["rate"] == "none":
            continue  # predicted = measured there by construction
        errors = [p["predicted_s"] / s - 1 for s in p["cycle_s"]]
        print(f"2x2 {p['rate']}: predicted {p['predicted_s']:.3f} s/update, measured per cycle "
              + ", ".join(f"{s:.3f}" for s in p["cycle_s"]) + f" (errors {', '.join(f'{e:+.0%}' for e in errors)})")
        assert abs(statistics.median(errors)) <= 0.15, (p["rate"], p["predicted_s"], p["cycle_s"])
