"""bench-quality's pure parts: the strategies, the updates each runs, the run's options, what the log
says, the ratio to sync, the table (no lab)."""

from __future__ import annotations

import json

import pytest

from benchmarks import quality
from train.cluster import ClusterError, Host
from train.errors import OptionError
from train.recipe import presets
from train.recipe.strategies import CommError


def entries(text):
    return quality.parse_entries(text)


def test_sync_is_always_the_first_entry_and_each_strategy_runs_once():
    assert [e.label for e in entries("local-sgd:16,fp16")] == ["sync", "local-sgd:16", "fp16"]
    assert [e.label for e in entries("fp16, sync ,fp16")] == ["sync", "fp16"]
    assert [e.label for e in entries("")] == ["sync"]
    assert [e.label for e in entries("local-sgd")] == ["sync", "local-sgd:16"]  # comm.py's default H


def test_update_freq_is_sync_with_k_batches_per_update():
    e = entries("update-freq:4")[1]
    assert (e.label, e.comm, e.update_freq, e.period, e.updates(320)) == ("update-freq:4", "sync", 4, 4, 80)


@pytest.mark.parametrize("bad", ["fp8", "local-sgd:1", "local-sgd:x", "update-freq:1", "update-freq:", "auto",
                                 "fp16:2"])
def test_unknown_strategies_are_refused_in_one_line(bad):
    with pytest.raises(CommError):
        entries(bad)


def test_updates_are_rounded_up_so_every_run_ends_on_a_sync():
    assert quality.common_updates(300, entries("fp16")) == 300
    assert quality.common_updates(300, entries("local-sgd:16")) == 304
    assert quality.common_updates(300, entries("local-sgd:16,local-sgd:64")) == 320
    assert quality.common_updates(300, entries("local-sgd:16,update-freq:3")) == 336
    assert quality.common_updates(64, entries("local-sgd:64")) == 64
    with pytest.raises(ValueError):
        quality.common_updates(0, entries("sync"))


def test_every_strategy_sees_the_same_samples():
    """Same updates of the same batches; update-freq:K takes N/K updates of K batches."""
    es = entries("fp16,local-sgd:16,local-sgd:64,update-freq:4")
    n = quality.common_updates(300, es)
    assert {e.updates(n) * e.update_freq for e in es} == {n}
    assert [e.updates(n) for e in es] == [320, 320, 320, 320, 80]
    assert all(e.updates(n) % (e.period // e.update_freq) == 0 for e in es)  # local-sgd ends on a sync


def test_run_ids_have_no_colon():
    assert entries("local-sgd:16")[1].slug == "local-sgd-16"


def test_the_runs_options_validate_once_at_the_end_and_save_only_for_bleu():
    over = quality.run_overrides(["encoder_embed_dim=256"], 304, bleu=False)
    options = presets.resolve("tiny", over).options
    assert options["encoder_embed_dim"] == 256
    assert options["max_update"] == options["validate_after_updates"] == 304
    assert options["no_save"] is True and options["save_interval_updates"] == 0
    assert presets.resolve("tiny", quality.run_overrides([], 304, bleu=True)).options["no_save"] is False


def test_max_update_in_set_is_refused():
    with pytest.raises(OptionError, match="--updates"):  # bad input: fab exits 2
        quality.run_overrides(["max_update=50"], 300, bleu=False)


def test_ratio_to_sync():
    assert quality.ratio(4.08, 4.0) == pytest.approx(0.02)
    assert quality.ratio(3.9, 4.0) == pytest.approx(-0.025)
    assert quality.ratio(None, 4.0) is None and quality.ratio(4.0, None) is None


CONFIG = ("2026-11-23 06:00:00 | INFO | fairseq_cli.train | {'_name': None, 'distributed_training': {"
          "'ddp_backend': 'legacy_ddp', 'ddp_comm_hook': 'none'}, 'optimization': {'update_freq': [1], "
          "'use_bmuf': %s}, 'bmuf': {'block_lr': 1.0, 'block_momentum': 0.5, 'global_sync_iter': %d}}")


def fake_log(updates: int, valid_loss: float, bmuf: bool = False, period: int = 50, bsz: float = 232.6) -> str:
    lines = [CONFIG % (bmuf, period),
             "2026-11-23 06:00:01 | INFO | fairseq_cli.train | num. shared model params: 3,935,232 (num. trained: "
             "3,935,232)",
             "2026-11-23 06:00:01 | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)"]
    for u in range(10, updates + 1, 10):
        lines.append(f'2026-11-23 06:00:{u % 60:02d} | INFO | train_inner | {{"epoch": 1, "update": 0.5, '
                     f'"loss": "{10 - u / 100:.3f}", "num_updates": "{u}", "bsz": "{bsz}", "wall": "{u}"}}')
    half = updates // 2
    lines.append(f'2026-11-23 06:01:00 | INFO | train | {{"epoch": 1, "train_loss": "7.7", "train_bsz": "{bsz}", '
                 f'"train_num_updates": "{half}"}}')
    lines.append(f'2026-11-23 06:02:00 | INFO | valid | {{"epoch": 2, "valid_loss": "{valid_loss}", '
                 f'"valid_nll_loss": "{valid_loss - 1:.3f}", "valid_ppl": "4.2", "valid_num_updates": "{updates}"}}')
    lines.append(f'2026-11-23 06:02:00 | INFO | train | {{"epoch": 2, "train_loss": "4.6", "train_bsz": "{bsz}", '
                 f'"train_num_updates": "{updates}"}}')
    lines.append("2026-11-23 06:02:01 | INFO | fairseq_cli.train | done training in 120.1 seconds")
    return "\n".join(lines) + "\n"


def test_result_from_rank0s_log():
    sync = quality.result_from_log(entries("")[0], 300, fake_log(300, 4.0))
    assert sync["finished"] and sync["valid_loss"] == 4.0 and sync["valid_at_update"] == 300
    assert sync["valid_nll_loss"] == 3.0 and sync["validations"] == 1 and sync["devices"] == 2
    assert sync["samples_logged"] == round(232.6 * 300)
    assert sync["synced_at_end"] and sync["syncs_every"] == 1 and sync["params"] == 3935232
    assert sync["fairseq_options"] == {"use_bmuf": False, "global_sync_iter": 50, "block_momentum": 0.5,
                                       "ddp_comm_hook": "none", "ddp_backend": "legacy_ddp", "update_freq": 1}
    assert sync["curve"][0] == [10, 9.9] and len(sync["curve"]) == 30


def test_local_sgd_counts_as_synced_only_with_bmuf_on_at_its_period_and_a_whole_number_of_periods():
    e = entries("local-sgd:16")[1]
    assert quality.result_from_log(e, 304, fake_log(304, 4.1, bmuf=True, period=16))["synced_at_end"]
    assert not quality.result_from_log(e, 304, fake_log(304, 4.1, bmuf=False, period=16))["synced_at_end"]
    assert not quality.result_from_log(e, 304, fake_log(304, 4.1, bmuf=True, period=50))["synced_at_end"]
    assert not quality.result_from_log(e, 300, fake_log(300, 4.1, bmuf=True, period=16))["synced_at_end"]


def test_samples_under_bmuf_are_the_references_when_the_same_batches_were_trained():
    es = entries("fp16,local-sgd:16")
    results = [quality.result_from_log(es[0], 304, fake_log(304, 4.0)),
               quality.result_from_log(es[1], 304, fake_log(304, 4.04)),
               # rank 0 logs only its own batches between syncs: half the sentences
               quality.result_from_log(es[2], 304, fake_log(304, 4.12, bmuf=True, period=16, bsz=116.3))]
    out = quality.with_samples_and_ratios(results)
    assert out[0]["samples"] == out[1]["samples"] == out[2]["samples"] == round(232.6 * 304)
    assert out[2]["samples_logged"] < out[2]["samples"] and "same batches" in out[2]["samples_note"]
    assert out[0]["ratio"] == 0 and out[1]["ratio"] == pytest.approx(0.01) and out[2]["ratio"] == pytest.approx(0.03)


def report_of(results):
    return {"preset": "tiny", "overrides": [], "dataset": "synthetic", "ranks": 2, "n_hosts": 2, "updates": 304,
            "updates_asked": 300, "bleu_measured": True, "results": results, "path": "reports/bench/q.json",
            "incomplete": None}


def sample_results():
    rows = [dict(strategy="sync", updates=304, samples=70710, valid_loss=4.0, ratio=0.0, bleu=70.12, wall_s=301.2,
                 tx_per_update=15.8e6, s_per_update=0.99, syncs_every=1, update_freq=1, synced_at_end=True),
            dict(strategy="fp16", updates=304, samples=70710, valid_loss=4.008, ratio=0.002, bleu=None, wall_s=290.0,
                 s_per_update=0.95, syncs_every=1, update_freq=1, synced_at_end=True),
            dict(strategy="local-sgd:16", updates=304, samples=70710, valid_loss=4.2, ratio=0.05, bleu=61.5,
                 wall_s=200.0, s_per_update=0.66, syncs_every=16, update_freq=1, synced_at_end=True)]
    return rows


def test_table_has_a_row_per_strategy_with_the_ratio_to_sync():
    lines = quality.table(sample_results()).splitlines()
    assert lines[0].split() == ["strategy", "updates", "samples", "valid", "loss", "vs", "sync", "BLEU", "MB/update",
                                "wall(s)", "s/update"]
    assert lines[1].split() == ["sync", "304", "70,710", "4.000", "(ref)", "70.12", "15.80", "301", "0.99"]
    assert lines[2].split() == ["fp16", "304", "70,710", "4.008", "+0.2%", "-", "-", "290", "0.95"]
    assert lines[3].split()[:5] == ["local-sgd:16", "304", "70,710", "4.200", "+5.0%"]


def test_summary_says_which_strategies_are_within_3_percent_and_the_rounding():
    text = quality.summary(report_of(sample_results()))
    assert "fp16: valid loss 4.008 vs sync's 4.000 (+0.2%): within 3% of sync" in text
    assert "local-sgd:16: valid loss 4.200 vs sync's 4.000 (+5.0%): NOT within 3% of sync" in text
    assert "300 asked, rounded up to a multiple of 16" in text
    assert text.endswith("JSON reports/bench/q.json")


def test_summary_flags_a_run_whose_ranks_were_not_synced():
    rows = sample_results()
    rows[2]["synced_at_end"] = False
    assert "NOT synced" in quality.summary(report_of(rows))


def test_refuses_one_host_and_half_precision_on_cpu_before_touching_them():
    cpu = [Host(name, f"10.0.0.{i}") for i, name in enumerate(["a", "b"], 1)]
    with pytest.raises(ClusterError, match="two hosts"):
        quality.bench_quality(cpu[:1], entries(""))
    with pytest.raises(ClusterError, match="bf16 needs GPUs"):
        quality.bench_quality(cpu, entries(""), precision="bf16")


def test_bad_override_is_refused_before_any_run(monkeypatch):
    cpu = [Host(name, f"10.0.0.{i}") for i, name in enumerate(["a", "b"], 1)]
    monkeypatch.setattr(quality, "run_one", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(OptionError, match="unknown option"):
        quality.bench_quality(cpu, entries("fp16"), overrides=["encoder_embed_dimm=256"])


def test_a_failed_run_still_writes_what_finished(monkeypatch, tmp_path):
    cpu = [Host(name, f"10.0.0.{i}") for i, name in enumerate(["a", "b"], 1)]
    done = sample_results()[0] | {"samples_logged": 70710, "epoch": 4}

    def run_one(hosts, entry, *args, **kwargs):
        if entry.label == "sync":
            return dict(done)
        raise ClusterError("v100b: rank 1 died")

    written = {}
    monkeypatch.setattr(quality, "run_one", run_one)
    monkeypatch.setattr(quality.measurements, "write", lambda report, kind, when:
                        written.update(report=report, kind=kind) or tmp_path / "q.json")
    with pytest.raises(ClusterError, match="rank 1 died"):
        quality.bench_quality(cpu, entries("fp16"), say=lambda *_: None)
    assert written["kind"] == "quality"
    assert [r["strategy"] for r in written["report"]["results"]] == ["sync"]
    assert "rank 1 died" in written["report"]["incomplete"]
    json.dumps(written["report"])  # the JSON is writable


def test_summary_says_when_update_freq_runs_fewer_updates_of_more_batches():
    rows = sample_results()[:1] + [dict(strategy="update-freq:4", updates=76, samples=70710, valid_loss=4.1,
                                        ratio=0.025, syncs_every=1, update_freq=4, synced_at_end=True)]
    text = quality.summary(report_of(rows))
    assert "(update-freq:K: N/K of K batches)" in text
    assert "update-freq:4: valid loss 4.100 vs sync's 4.000 (+2.5%): within 3% of sync" in text
    assert "update-freq" not in quality.summary(report_of(sample_results())).splitlines()[0]


def test_summary_warns_when_the_reference_learned_nothing_and_names_what_an_interrupted_run_missed():
    rows = sample_results()[:1]
    rows[0]["bleu"] = 0.0
    report = report_of(rows) | {"incomplete": "KeyboardInterrupt: ", "strategies": ["sync", "fp16", "local-sgd:16"]}
    text = quality.summary(report)
    assert "WARNING: the reference (sync) did not learn to translate (BLEU 0.00)" in text
    assert "INCOMPLETE: KeyboardInterrupt: ; not measured: fp16, local-sgd:16" in text
    assert "WARNING" not in quality.summary(report_of(sample_results()))


def test_a_second_sigterm_during_the_cleanup_does_not_cut_it_short(monkeypatch):
    """`timeout` (or a user) sends SIGTERM again while bench-quality stops its run: the ranks are still
    stopped and the checkpoints removed (before, the second signal raised out of the cleanup)."""
    import os
    import signal

    from benchmarks import step

    done = []

    def stop(run, hosts):
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, mid-cleanup
        done.append("stop")

    monkeypatch.setattr(quality.launch, "stop", stop)
    monkeypatch.setattr(quality, "run_all", lambda hosts, cmd: done.append(cmd))
    run = quality.Run(run_id="quality-x-sync", hosts=["v100a"], preset="tiny", overrides=[], dataset="synthetic")
    with step.signals_raise():
        quality.stop_and_clean(run, [], started=True, say=done.append)
    assert done[0] == "stop" and "checkpoints/*.pt" in done[1] and "stopped quality-x-sync" in done[2], done


def test_fab_bench_quality_checks_its_options_before_touching_a_host_and_trains_as_fab_train(monkeypatch):
    gpus = [Host(name, f"10.0.0.{i}", gpus=1) for i, name in enumerate(["a", "b"], 1)]
    monkeypatch.setattr(quality, "bench_quality", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(ClusterError, match="bench-quality measures named ones"):
        quality.run(gpus, comm="sync,auto")
    with pytest.raises(ClusterError, match="--updates must be at least 1"):
        quality.run(gpus, updates="0")
    asked, said = {}, []
    monkeypatch.setattr(quality, "bench_quality", lambda hosts, entries, **kw: asked.update(entries=entries, **kw)
                        or "the report")
    monkeypatch.setattr(quality, "summary", lambda report: f"summary of {report}")
    assert quality.run(gpus, comm="fp16", set_text="adam_betas=(0.9, 0.98),lr=0.002", updates="40",
                       bleu=False, say=said.append) == "the report"
    assert [e.label for e in asked["entries"]] == ["sync", "fp16"] and asked["updates"] == 40
    assert asked["overrides"] == ["adam_betas=(0.9, 0.98)", "lr=0.002"]
    assert asked["precision"] == "fp16" and asked["bleu"] is False  # GPU hosts: as fab train
    assert said == ["summary of the report"]
