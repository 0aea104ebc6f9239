"""`fab bench-quality` on the provisioned lab: sync and local SGD trained for the same samples, each a
fresh run that is scored at its end and leaves nothing behind (about 2 minutes on a 2-core machine)."""

from __future__ import annotations

import json
import math
import os

import pytest
from labtools import TOP, fab, processes, ssh

BENCH = TOP / "reports" / "bench"
RUNS = "/data/tandem/runs"


def training_processes(cfg) -> dict[str, str]:
    found = {name: processes(cfg, name, "fairseq_train|torchrun|fairseq[-_]generate") for name in cfg.names}
    return {name: procs for name, procs in found.items() if procs}


@pytest.fixture(scope="module")
def quality_run(data_ready):
    latest = TOP / "reports" / "latest"
    before = os.readlink(latest) if latest.is_symlink() else None
    # 30 updates asked: rounded up to 32, a multiple of H = 8, so that local SGD ends on a sync; its
    # synchronous start cut to 8 updates (tiny's default, its 100 warm-up updates, would be the whole run)
    proc = fab(data_ready, "bench-quality", "--comm", "local-sgd:8", "--updates", "30", "--set",
               "local_sgd_sync_updates=8", timeout=600)
    after = os.readlink(latest) if latest.is_symlink() else None
    return proc.stdout, json.loads((BENCH / "quality-latest.json").read_text()), before, after


def test_both_strategies_get_a_finite_valid_loss_after_the_same_samples(quality_run):
    out, report, _, _ = quality_run
    sync, local = report["results"]
    assert (sync["strategy"], local["strategy"]) == ("sync", "local-sgd:8")
    assert report["updates"] == sync["updates"] == local["updates"] == 32  # 30 rounded up to a multiple of 8
    for r in (sync, local):
        assert r["finished"] and r["devices"] == 2, r
        assert math.isfinite(r["valid_loss"]) and r["valid_at_update"] == 32 and r["validations"] == 1, r
        assert 0 <= r["bleu"] <= 100, r  # fab evaluate's path on the final checkpoint
    assert sync["samples"] == local["samples"] > 0  # the same batches: only how the ranks share differs
    assert local["ratio"] == pytest.approx(local["valid_loss"] / sync["valid_loss"] - 1)
    assert "local-sgd:8" in out and "vs sync" in out and "of sync" in out  # the table and the verdict


def test_local_sgd_really_ran_bmuf_and_synced_every_8_updates(quality_run):
    _, report, _, _ = quality_run
    sync, local = report["results"]
    assert local["fairseq_options"]["use_bmuf"] is True and local["fairseq_options"]["global_sync_iter"] == 8
    assert local["synced_at_end"] and local["syncs_every"] == 8
    assert sync["fairseq_options"]["use_bmuf"] is False
    assert local["sync_updates"] == 8 and "synchronous for its first 8 updates" in quality_run[0]
    # the NICs say so: sync all-reduces the fp32 gradient every update (2 ranks: S bytes each way), local SGD
    # the gradient in its 8 synchronous updates, then the parameters every 8th (4 syncs in 32 updates); each
    # host sent at least that, and local SGD far less than sync
    size = 4 * sync["params"]
    for host, sent in sync["tx_bytes"].items():
        assert sent >= 0.8 * 32 * size, (host, sent, size)
    for host, sent in local["tx_bytes"].items():
        assert sent >= 0.8 * (8 + 32 // 8) * size, (host, sent, size)
    assert local["tx_per_update"] < 0.5 * sync["tx_per_update"], (local["tx_bytes"], sync["tx_bytes"])


def test_nothing_left_behind_and_reports_latest_untouched(quality_run, data_ready):
    _, report, before, after = quality_run
    assert before == after
    assert not training_processes(data_ready.cfg)
    for r in report["results"]:
        assert r["run_id"].startswith("quality-")
        left = ssh(data_ready.cfg, data_ready.cfg.names[0], f"ls {RUNS}/{r['run_id']}/checkpoints/").stdout.split()
        assert not [f for f in left if f.endswith(".pt")], left  # the checkpoints BLEU needed are removed
