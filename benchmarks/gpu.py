"""On one GPU machine, without SSH to itself: tandem's training commands run there, figures kept.

    python -m benchmarks.gpu --data DIR --work DIR --out DIR [--runs base-fp16,big-fp16,...]

`fab train` needs SSH to its hosts; a lent GPU machine (one GPU, no sshd, no internet) has
none. Each run here starts the exact line `fab train` would start on rank 0 of a one-host
cluster (`train.command.training_command`: torchrun, fairseq-train, the monitor beside it),
waits for it, and records what the users ask of a GPU: s/update and words/s (median of the
logged intervals of the run's second half: a GPU run speeds up for its first few hundred
updates while the caching allocator and cuBLAS meet each new batch shape), the loss, peak GPU memory and utilization
from the monitor's NVML samples. The first run also gets tandem's report (`train.report`).
Writes OUT/gpu.json, OUT/<run>.log and OUT/report-<run>/ (answers.json, the GPU plot).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import psutil

from train.agent.keeper import stop
from train.agent.trainer import profile
from train.plan import batch as batch_model
from train.plan import mfu
from train.recipe import logformat, presets
from train.run import command

BIG, BASE = "transformer_vaswani_wmt_en_de_big", "transformer_wmt_en_de"
BIG_30 = ["max_update=30", "log_interval=2", "no_save=true"]  # ~2 s an update at the recipe's batch
BASE_300 = ["max_update=300", "log_interval=10", "no_save=true"]
BIG_16 = ["max_update=16", "log_interval=2", "no_save=true"]  # a lent GPU's 8 minutes: medians of updates 9-16
# an epoch of the WMT16-shaped corpus at 50,972 x 9 (275 batches): every batch once, the longest pairs' too
BIG_32 = ["max_update=32", "log_interval=2", "no_save=true"]
SWITCHES_OFF = ["fused_adam=false", "flat_master_copy=false"]  # train/agent/trainer/fast_steps.py
# name → (preset, precision, overrides). Throughput runs keep no checkpoints (GBs for big).
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "base-fp16": ("transformer_wmt_en_de", "fp16", ["max_update=600", "log_interval=10"]),
    # where an update's time goes (run with --profile 300:20), and whether more data workers help
    "base-fp16-400": ("transformer_wmt_en_de", "fp16", ["max_update=400", "log_interval=10", "no_save=true"]),
    "base-fp16-400-w4": ("transformer_wmt_en_de", "fp16", ["max_update=400", "log_interval=10", "no_save=true",
                                                            "num_workers=4"]),
    "big-fp16-10k-400": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=400", "log_interval=10",
                                                                       "max_tokens=10240", "no_save=true"]),
    "base-fp16-400-cudnn": ("transformer_wmt_en_de", "fp16", ["max_update=400", "log_interval=10", "no_save=true"]),
    "big-fp16-10k-400-cudnn": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=400", "log_interval=10",
                                                                             "max_tokens=10240", "no_save=true"]),
    # larger batches per GPU: the H100's 80 GB take them, and its launch-bound small updates fill up
    "base-fp16-32k": ("transformer_wmt_en_de", "fp16", ["max_update=300", "log_interval=10", "max_tokens=32768",
                                                         "no_save=true"]),
    "big-fp16-20k": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=300", "log_interval=10",
                                                                   "max_tokens=20480", "no_save=true"]),
    "base-fp16-16k": ("transformer_wmt_en_de", "fp16", ["max_update=300", "log_interval=10", "max_tokens=16384",
                                                         "no_save=true"]),
    # the recipe's 458,752 tokens per update: on one H100 ~15 batches an update (log every 2 updates)
    "big-fp16": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=60", "log_interval=2", "no_save=true"]),
    "big-bf16": ("transformer_vaswani_wmt_en_de_big", "bf16", ["max_update=300", "log_interval=10", "no_save=true"]),
    "big-fp16-10k": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=300", "log_interval=10",
                                                                   "max_tokens=10240", "no_save=true"]),
    "big-bf16-10k": ("transformer_vaswani_wmt_en_de_big", "bf16", ["max_update=300", "log_interval=10",
                                                                   "max_tokens=10240", "no_save=true"]),
    # the presets' old batches, for the memory model's rows (benchmarks/README.md, "The memory model")
    "base-fp16-4k": ("transformer_wmt_en_de", "fp16", ["max_update=300", "log_interval=10", "max_tokens=4096",
                                                        "no_save=true"]),
    "big-fp16-3.5k": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=300", "log_interval=10",
                                                                    "max_tokens=3584", "no_save=true"]),
    # issue 36, side by side: the presets' defaults with tandem's GPU step switches off ("-before":
    # fairseq's Python Adam, per-tensor fp16 master copies, the allocator's default segments) and on
    "big-fp16-before": (BIG, "fp16", [*BIG_30, *SWITCHES_OFF]),
    "big-fp16-after": (BIG, "fp16", BIG_30),
    "base-fp16-before": (BASE, "fp16", [*BASE_300, *SWITCHES_OFF]),
    "base-fp16-after": (BASE, "fp16", BASE_300),
    # fairseq's memory-efficient fp16 (no fp32 master copy; its Adam steps fp16 weights in fp32)
    "big-fp16-mefp16": (BIG, "fp16", [*BIG_30, "memory_efficient_fp16=true"]),
    # bf16's master copy is per tensor (fairseq does not flatten it): fused Adam's case
    "big-bf16-after": (BIG, "bf16", BIG_30),
    # the next switches, not yet measured (train/agent/trainer/fused_loss.py, train/agent/trainer/compiled_layers.py):
    # the
    # loss from the logits, the layers through torch.compile (compiled on the first update: the second
    # half's median leaves that out), and both; side by side with the "-after" runs
    "big-fp16-fusedloss": (BIG, "fp16", [*BIG_30, "fused_loss=true"]),
    "big-fp16-compiled": (BIG, "fp16", [*BIG_30, "compile_layers=true"]),
    "big-fp16-fast": (BIG, "fp16", [*BIG_30, "fused_loss=true", "compile_layers=true"]),
    "base-fp16-fusedloss": (BASE, "fp16", [*BASE_300, "fused_loss=true"]),
    "base-fp16-compiled": (BASE, "fp16", [*BASE_300, "compile_layers=true"]),
    "base-fp16-fast": (BASE, "fp16", [*BASE_300, "fused_loss=true", "compile_layers=true"]),
    # on the WMT16-shaped corpus (on_gpu.sh's CORPUS=wmt16): the derived batch (50,972 x 9 on an H100,
    # 57,344 x 8 on an H200) without (an epoch: its peak is the longest pairs') and with both switches,
    # and big at 57,344 x 8 (the batch measured under torch's default allocator on an H200; refused on an
    # H100 by the model)
    "big-fp16-after32": (BIG, "fp16", BIG_32),
    "big-fp16-fast16": (BIG, "fp16", [*BIG_16, "fused_loss=true", "compile_layers=true"]),
    "big-fp16-57k": (BIG, "fp16", [*BIG_16, "max_tokens=57344", "tokens_per_update=458752"]),
    # past the default allocator's fit on an 80 GB GPU (refused there, naming the predicted peak); under
    # expandable segments the model allows it: the run that measures a larger batch for the cap
    "big-fp16-40k": ("transformer_vaswani_wmt_en_de_big", "fp16", ["max_update=100", "log_interval=10",
                                                                   "max_tokens=40960", "no_save=true"]),
}
VOCAB = 32000  # the memory model's and MFU's vocabulary where the data's is not read

# Runs with torch's cuDNN attention left on, as fairseq-train alone would run (see
# train.agent.trainer.fairseq_train.attention_without_cudnn), to compare side by side.
RUN_ENV: dict[str, dict[str, str]] = {name: {"TANDEM_CUDNN_ATTENTION": "1"} for name in RUNS if name.endswith("-cudnn")}
RUN_ENV.update({name: {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"} for name in RUNS
                if name.endswith("-before")})


def cluster_nic() -> str:
    """The first NIC that is not loopback (the monitor samples it)."""
    names = [n for n in psutil.net_if_addrs() if n != "lo"]
    return names[0] if names else "lo"


def gpu_model() -> tuple[str, float]:
    """The first GPU's name as NVML gives it (MFU's peak) and its memory in MiB."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True)
    name, mib = out.stdout.splitlines()[0].rsplit(",", 1)
    return name.strip(), float(mib)


def batch_for(preset: presets.Preset, overrides: list[str], precision: str, gpus: int,
              gpu_mib: float) -> batch_model.Batch:
    """What `fab train` derives on this machine (train.plan.batching): the preset's tokens per update,
    max_tokens the GPU holds. A run that sets max_tokens measures one batch an update, as the figures
    recorded before the derivation existed (benchmarks/README.md), unless it sets tokens_per_update too
    (update_freq then follows: 57,344 x 8)."""
    options = preset.options
    cap = batch_model.largest_max_tokens(options, VOCAB, gpu_mib / 1024, precision)
    given = int(options["max_tokens"]) if presets.overridden(overrides, "max_tokens") else None
    asked = not given or presets.overridden(overrides, "tokens_per_update")
    target = int(options["tokens_per_update"]) if options.get("tokens_per_update") and asked else None
    return batch_model.derive(target, gpus, cap, max_tokens=given, why=f"{gpu_mib / 1024:.0f} GiB")


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True)
    return len(out.stdout.split())


def wait_for(pid_file: Path, timeout_s: float) -> float:
    """Seconds until the process in `pid_file` (torchrun's session) is gone; TimeoutError after
    `timeout_s` (the caller stops the run)."""
    started = time.monotonic()
    while not pid_file.exists() and time.monotonic() - started < 30:
        time.sleep(0.2)
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    while pid and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"run {pid_file.parent.name} still going after {timeout_s:.0f} s: stopped")
        time.sleep(0.5)
    return time.monotonic() - started


def while_busy(util: list[float]) -> list[float]:
    """The samples from the GPU's first busy one to its last: start-up (data loading, CUDA init)
    and the end leave it idle, and would drag the median to 0."""
    busy = [i for i, u in enumerate(util) if u > 0]
    return util[busy[0]: busy[-1] + 1] if busy else []


def figures(log_text: str, samples: list[dict]) -> dict:
    """The run's medians over its second half (the warm part), and its GPU samples."""
    log = logformat.parse_log(log_text.splitlines())
    last = max((r.update or 0) for r in log.of("train_inner")) if log.of("train_inner") else 0
    inner = [r for r in log.of("train_inner") if (r.update or 0) > last / 2]
    per_update = [r.get("wpb") / r.get("wps") for r in inner if r.get("wps") and r.get("wpb")]
    gpu = [g for s in samples for g in (s.get("gpus") or [])]
    busy = while_busy([g["util_percent"] for g in gpu])
    return {
        "updates": max((r.update or 0) for r in log.records) if log.records else 0,
        "finished": log.finished,
        "params": logformat.logged_params(log_text),
        "s_per_update": statistics.median(per_update) if per_update else None,
        "wps": statistics.median([r.get("wps") for r in inner]) if inner else None,
        "wpb": statistics.median([r.get("wpb") for r in inner]) if inner else None,
        "loss_first": log.of("train_inner")[0].get("loss") if log.of("train_inner") else None,
        # fairseq's wall clock at its first log line: start-up, and what compiling costs (compile_layers)
        "wall_at_first_log": log.of("train_inner")[0].get("wall") if log.of("train_inner") else None,
        "loss_last": inner[-1].get("loss") if inner else None,
        "gpu_util_median": statistics.median(busy) if busy else None,
        "gpu_util_samples": busy,
        "gpu_mem_peak_mb": max(g["mem_used_mb"] for g in gpu) if gpu else None,
        "samples": len(samples),
        "errors": log.errors[-3:],
    }


def fill_figures(result: dict, max_tokens: int, update_freq: int, gpus: int) -> dict:
    """The fill (target words an update over max_tokens x update_freq x GPUs) and the padded tokens a
    second (what the batches could hold, padding included: words/s over the fill), beside words/s:
    words/s of two corpora or batches compare only at the same fill."""
    fill = batch_model.fill(result.get("wpb"), max_tokens, update_freq, gpus)
    padded = max_tokens * update_freq * gpus / result["s_per_update"] if result.get("s_per_update") else None
    return {"fill": round(fill, 4) if fill else None, "padded_tokens_per_s": round(padded) if padded else None}


def updates_logged(log_path: Path) -> int:
    found = re.findall(r'"num_updates": "(\d+)"', log_path.read_text(errors="replace")) if log_path.exists() else []
    return int(found[-1]) if found else 0


def sample_stacks(run_dir: Path, log_path: Path, first: int, seconds: int, out: Path) -> None:
    """py-spy on the training process once it passed update `first`: where its threads spend the
    wall time (idle waits included), beside torch.profiler's operator view. Best effort: the
    run's own figures do not depend on it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    deadline = time.monotonic() + 600
    while updates_logged(log_path) < first and time.monotonic() < deadline:
        time.sleep(1)
    workers = [p for p in psutil.process_iter(["cmdline"])
               if "train.agent.trainer.fairseq_train" in " ".join(p.info["cmdline"] or []) and str(run_dir) in
               " ".join(p.info["cmdline"] or []) and "torchrun" not in " ".join(p.info["cmdline"] or [])]
    if not workers or not Path(spy).exists():
        out.write_text(f"no py-spy run: workers {[w.pid for w in workers]}, py-spy at {spy}\n")
        return
    raw = out.with_suffix(".raw")
    done = subprocess.run([spy, "record", "--pid", str(workers[0].pid), "--duration", str(seconds), "--rate", "200",
                           "--format", "raw", "--idle", "--threads", "--nonblocking", "--output", str(raw)],
                          capture_output=True, text=True)
    if not raw.exists():
        out.write_text(f"py-spy failed (exit {done.returncode}): {done.stderr[-2000:]}\n")
        return
    summary = profile.stack_summary(raw.read_text())
    out.write_text("\n".join([f"py-spy, {seconds} s of pid {workers[0].pid} from update {first}; share of samples",
                              "inclusive:", *[f"  {s:6.1%}  {f}" for f, s in summary["inclusive"]],
                              "self:", *[f"  {s:6.1%}  {f}" for f, s in summary["self"]]]) + "\n")


def run_one(name: str, data: Path, work: Path, venv: str, gpus: int, timeout_s: float,
            profile_window: tuple[int, int] | None = None, out: Path | None = None) -> dict:
    preset_name, precision, overrides = RUNS[name]
    preset = presets.resolve(preset_name, overrides)
    gpu_name, gpu_mib = gpu_model()
    derived = batch_for(preset, overrides, precision, gpus, gpu_mib)
    preset.options["max_tokens"] = derived.max_tokens
    peak = batch_model.peak_gib(preset.options, VOCAB, derived.max_tokens, precision)
    said = {"run": name, "preset": preset_name, "precision": precision, "overrides": overrides, "gpus": gpus,
            "gpu_name": gpu_name, "gpu_mib": gpu_mib, "max_tokens": derived.max_tokens,
            "update_freq": derived.update_freq, "batch": derived.line(), "predicted_peak_gib": round(peak, 2)}
    print(f"== {name}: {derived.line()}; predicted peak {peak:.1f} GiB", flush=True)
    if not batch_model.fits(preset.options, VOCAB, derived.max_tokens, gpu_mib / 1024, precision):
        said["refused"] = (f"max_tokens {derived.max_tokens:,} is predicted to need {peak:.1f} GiB "
                           f"({peak * batch_model.MARGIN:.1f} with the margin); "
                           f"{gpu_name} has {gpu_mib / 1024:.1f} GiB")
        print(json.dumps(said), flush=True)
        return said
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    (launch,) = command.launches(name, [{"address": "127.0.0.1", "gpus": gpus, "nic": cluster_nic()}],
                                 master_port=29500, data_dir=str(data), run_dir=str(run_dir), venv=venv,
                                 precision=precision, update_freq=derived.update_freq)
    env = {**os.environ, **RUN_ENV.get(name, {})}
    with mock.patch.dict(os.environ, RUN_ENV.get(name, {})):  # command.environment reads the allocator here
        line = command.training_command(preset, launch)
    spy = None
    if profile_window and out:
        # tandem's entry point (train/agent/trainer/fairseq_train.py) profiles a window of updates; py-spy
        # samples after it, so that the two do not measure each other
        first, count = profile_window
        env["TANDEM_PROFILE"] = f"{first}:{count}:{out}/profile-{name}"
        spy = threading.Thread(target=sample_stacks, daemon=True,
                               args=(run_dir, Path(launch.log_path), first + count + 20, 10, out / f"pyspy-{name}.txt"))
    print(f"== {name}: {line}", flush=True)
    subprocess.run(["bash", "-c", line], check=True, env=env)
    if spy:
        spy.start()
    try:
        seconds = wait_for(Path(launch.pid_file), timeout_s)
    except BaseException:  # a timeout, Ctrl-C: no rank (torchrun's workers have sessions of their own) is left
        stop.stop(str(run_dir))
        raise
    time.sleep(3)  # the monitor's last sample, then it ends by itself
    if spy:
        spy.join(timeout=30)
    log_text = Path(launch.log_path).read_text(errors="replace")
    samples_path = run_dir / "samples.jsonl"
    samples = [json.loads(x) for x in samples_path.read_text().splitlines()] if samples_path.exists() else []
    result = {**said, "wall_s": round(seconds, 1), "command": line, **figures(log_text, samples)}
    result["mfu"] = mfu.of_run(preset.options, VOCAB, result.get("wps"), gpus, gpu_name)
    result.update(fill_figures(result, derived.max_tokens, derived.update_freq, gpus))
    if result.get("gpu_mem_peak_mb"):
        result["peak_vs_model"] = round(result["gpu_mem_peak_mb"] / 1024 / peak - 1, 3)
    print(json.dumps({k: v for k, v in result.items() if k != "command"}), flush=True)
    return result


def report_for(result: dict, work: Path, data: Path, out: Path) -> Path:
    """tandem's report page on one run, from the files `fab report` would have collected."""
    from train.report import page

    name = result["run"]
    local = out / f"report-{name}"
    shutil.rmtree(local, ignore_errors=True)
    for sub in ("logs", "samples"):
        (local / sub).mkdir(parents=True)
    shutil.copy2(work / name / "train.log", local / "logs" / "gpu0.log")
    if (work / name / "samples.jsonl").exists():
        shutil.copy2(work / name / "samples.jsonl", local / "samples" / "gpu0.jsonl")
    if (data / "corpus.json").exists():
        shutil.copy2(data / "corpus.json", local / "corpus.json")
    listing = subprocess.run(["ls", "-l", "--time-style=+%s", str(work / name / "checkpoints")],
                             capture_output=True, text=True)
    (local / "checkpoints.txt").write_text(listing.stdout)
    run = {"run_id": name, "hosts": ["gpu0"], "preset": result["preset"], "overrides": result["overrides"],
           "dataset": data.name, "precision": result["precision"], "gpu_name": result.get("gpu_name")}
    (local / "run.json").write_text(json.dumps(run))
    index, lines = page.build_report(local, None)
    print("\n".join(lines), flush=True)
    return index


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path, help="a prepared dataset's bin directory")
    p.add_argument("--work", required=True, type=Path, help="where the runs' directories go")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--runs", default="base-fp16,big-fp16,big-bf16", help=f"of {', '.join(RUNS)}")
    p.add_argument("--venv", default=sys.prefix, help="the training environment (default: this Python's)")
    p.add_argument("--timeout-s", type=float, default=240)
    p.add_argument("--profile", help="FIRST:COUNT: profile these updates (torch.profiler, then py-spy)")
    p.add_argument("--profile-runs", help="the runs to profile (default: all)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S") or 0) or None,
                   help="start no run after this many seconds (a lent GPU's time is short; default: $BUDGET_S)")
    a = p.parse_args(argv)
    started = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    results = []
    for name in [r for r in a.runs.split(",") if r]:
        if a.budget_s and time.monotonic() - started > a.budget_s:
            results.append({"run": name, "skipped": f"past the budget of {a.budget_s:.0f} s"})
            print(f"== {name}: skipped, past the budget of {a.budget_s:.0f} s", flush=True)
            continue
        try:
            profiled = a.profile and (not a.profile_runs or name in a.profile_runs.split(","))
            window = tuple(int(x) for x in a.profile.split(":")) if profiled else None
            result = run_one(name, a.data, a.work, a.venv, gpus, a.timeout_s, window, a.out)
        except (subprocess.CalledProcessError, TimeoutError) as e:
            result = {"run": name, "error": str(e)}
        results.append(result)
        log = a.work / name / "train.log"
        if log.exists():
            shutil.copy2(log, a.out / f"{name}.log")
        if name == "base-fp16" and "error" not in result:
            try:
                result["report"] = str(report_for(result, a.work, a.data, a.out))
            except Exception as e:  # the figures above still count
                result["report_error"] = repr(e)
        (a.out / "gpu.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r and (r.get("finished") or r.get("refused") or r.get("skipped"))
                    for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
