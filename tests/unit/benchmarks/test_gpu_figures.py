"""benchmarks/gpu.py: the figures a GPU run records."""

import statistics

from benchmarks.gpu import RUNS, figures, while_busy
from train.recipe import presets
from train.run.command import Launch, environment


def test_gpu_utilization_counts_the_training_not_the_idle_start_and_end():
    # samples every 2 s: CUDA init and data loading, training, then the process winding down
    util = [0, 0, 0, 0, 91, 70, 0, 92, 94, 0, 0, 0]
    assert while_busy(util) == [91, 70, 0, 92, 94]
    assert statistics.median(while_busy(util)) == 91
    assert while_busy([0, 0]) == []


def test_every_run_resolves_and_each_switch_run_turns_on_its_own():
    """A misspelt option fails here, not minutes into a lent GPU's time."""
    gpu = Launch("r", 0, 1, 1, "127.0.0.1", 29500, "/d", "/c", "/l", "lo", "/v", precision="fp16")

    def switches(name):
        preset, _, overrides = RUNS[name]
        env = environment(gpu, presets.resolve(preset, overrides))
        return {k for k in env if k in {"TANDEM_FUSED_LOSS", "TANDEM_COMPILE_LAYERS", "TANDEM_FUSED_ADAM"}}

    for name in RUNS:
        switches(name)
    assert switches("big-fp16-after") == {"TANDEM_FUSED_ADAM"}
    assert switches("big-fp16-fusedloss") == {"TANDEM_FUSED_ADAM", "TANDEM_FUSED_LOSS"}
    assert switches("base-fp16-compiled") == {"TANDEM_FUSED_ADAM", "TANDEM_COMPILE_LAYERS"}
    assert switches("base-fp16-fast") == {"TANDEM_FUSED_ADAM", "TANDEM_FUSED_LOSS", "TANDEM_COMPILE_LAYERS"}


def test_the_figures_keep_the_start_up_time_apart():
    """A compiled run's first update waits for the compiler: the figures say how long, and the
    median of the second half leaves it out."""
    line = ('2026-11-26 14:32:40 | INFO | train_inner | {{"epoch": 1, "update": {u}, "loss": "15.5", '
            '"wps": "{wps}", "wpb": "700", "num_updates": "{u}", "wall": "{wall}"}}')
    log = "\n".join(line.format(u=u, wps=10 if u == 5 else 1400, wall=40 + u) for u in (5, 10, 15, 20))
    got = figures(log, [])
    assert got["wall_at_first_log"] == 45
    assert got["wps"] == 1400


def test_every_figure_comes_with_its_fill_and_padded_tokens_a_second():
    """words/s counts target words only: beside it, the share of the batches they fill and the tokens
    a second the batches held, padding included (a run on the repeated sample and one on WMT16's
    lengths differ by their fill, not their speed)."""
    from benchmarks.gpu import fill_figures

    got = fill_figures({"wpb": 400_000, "s_per_update": 4.0, "wps": 100_000}, 50972, 9, 1)
    assert got == {"fill": 0.8719, "padded_tokens_per_s": 114687}
    assert fill_figures({"wpb": None, "s_per_update": None}, 50972, 9, 1) == {"fill": None,
                                                                               "padded_tokens_per_s": None}


def test_the_larger_big_batch_runs_at_57344_x_8_on_an_h200_and_is_refused_on_an_h100():
    from benchmarks.gpu import batch_for
    from train.plan import batch

    preset_name, precision, overrides = RUNS["big-fp16-57k"]
    preset = presets.resolve(preset_name, overrides)
    for mib, fits in ((143771, True), (81559, False)):
        b = batch_for(preset, overrides, precision, 1, mib)
        assert (b.max_tokens, b.update_freq) == (57344, 8), b.line()
        assert batch.fits(preset.options, 32000, b.max_tokens, mib / 1024, precision) is fits
