"""`fab bench-quality`: what a communication strategy costs in model quality, measured, not assumed.

The same model is trained from scratch once per strategy (`--comm sync,fp16,local-sgd:16`; sync
is always run, first, as the reference), each for the same number of training samples, and each
run's final validation loss is set beside the synchronous run's:

- every strategy takes the same number of updates N (`--updates`) with the same samples per
  update (the same preset, max_tokens and ranks: fairseq's batches and their order do not depend
  on the strategy); an `update-freq:K` entry (gradient accumulation: K batches per update) takes
  N / K updates, so that it too sees N updates' worth of samples;
- N is rounded up to a multiple of every local-sgd period H and every K, so that each run ends on
  a sync (BMUF averages the ranks' parameters every H updates): the ranks hold one model when it
  validates, and that is the model that is scored;
- validation runs once, at the end (`validate_after_updates=N`); no checkpoint is saved unless
  BLEU is measured, which then uses the final checkpoint (`checkpoint_last.pt`) and `fab
  evaluate`'s path (train.run.command.evaluation_command: fairseq-generate on the test set, beam
  5, SacreBLEU) on rank 0's host; the checkpoints are removed afterwards, the logs kept.

Each run is a fresh job, `quality-<time>-<strategy>`, started through train.run.launch as `fab
train` starts one (preflight included) but without touching `reports/latest`; it is followed to
its end and then stopped (train.run.launch.stop, which confirms no process is left), also on any
error, Ctrl-C, SIGTERM or SIGHUP. The final valid loss, the run's options (use_bmuf,
global_sync_iter, ddp_comm_hook, as fairseq logged them) and the loss curve come from rank 0's
log (train.recipe.logformat); the bytes each host's NIC sent during the run (its tx counter before
and after) show how much the strategy really exchanged.

Report: reports/bench/quality-<time>.json and quality-latest.json (train.plan.measurements), and a
table: strategy, updates, samples, valid loss, its ratio to sync's, BLEU, MB sent per update and
host, wall time (start-up included, BLEU's translation not).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from benchmarks.step import require_cluster, signals_ignored, signals_raise, tx_bytes
from train.cluster import ClusterError, Host, connect, run_all, world_size
from train.errors import OptionError
from train.hosts.remote import agent_command, venv_of
from train.plan import measurements
from train.recipe import logformat, presets, strategies
from train.recipe.record import Run
from train.recipe.strategies import CommError
from train.recipe.strategies import update_freq as update_freq_rung
from train.run import command, launch, preflight

REFERENCE = "sync"
TARGET = 0.03  # issue 15: local SGD's validation loss within 3% of sync's after the same samples
DEFAULT_COMM = "sync,fp16,local-sgd:16"
UNTRAINED_BLEU = 1.0  # below it the reference learned nothing yet (a model on the unigram plateau scores 0)
OWNED = ("max_update", "validate_after_updates")  # --updates sets them, for every strategy alike


@dataclass(frozen=True)
class Entry:
    """One strategy to measure: a train.recipe.strategies strategy, or sync with gradient accumulation."""

    label: str  # as the table shows it: sync, fp16, local-sgd:16, update-freq:4
    comm: str = "sync"
    update_freq: int = 1

    @property
    def period(self) -> int:
        """What the common number of updates must be a multiple of: H for local-sgd, K for update-freq."""
        return strategies.parse(self.comm).syncs_every * self.update_freq

    @property
    def slug(self) -> str:
        """The label in a run id: no colon (rsync and scp read `a:b` as a host)."""
        return self.label.replace(":", "-")

    def updates(self, n: int) -> int:
        """Updates this entry takes for the samples of n updates of the reference."""
        return n // self.update_freq


def parse_entries(text: str | None) -> list[Entry]:
    """`--comm`'s comma list; sync first (added when missing), each once, `update-freq:K` allowed."""
    entries = [Entry(REFERENCE)]
    for raw in (text or "").split(","):
        item = raw.strip().lower()
        if not item:
            continue
        try:
            k = update_freq_rung.parse(item)
        except ValueError as err:
            raise CommError(str(err)) from None
        if k is not None:
            entry = Entry(f"update-freq:{k}", "sync", k)
        elif item == "auto":
            raise CommError("--comm auto picks one strategy for a run; bench-quality measures named ones "
                            f"({strategies.syntax()}, update-freq:K)")
        else:
            strategy = strategies.parse(item)  # raises on an unknown one
            entry = Entry(str(strategy), str(strategy))
        if entry.label not in [e.label for e in entries]:
            entries.append(entry)
    return entries


def common_updates(n: int, entries: list[Entry]) -> int:
    """n rounded up to a multiple of every entry's period (each run ends on a sync; N / K whole)."""
    if n < 1:
        raise ValueError(f"--updates must be at least 1, not {n}")
    step = math.lcm(*(e.period for e in entries))
    return -(-n // step) * step


def run_overrides(overrides: list[str], updates: int, bleu: bool) -> list[str]:
    """The run's --set: the user's, then this benchmark's (which win): N updates, validation at the
    end only, no checkpoint unless BLEU needs the final one (then none mid-epoch)."""
    owned = [o for o in overrides if o.split("=", 1)[0].strip() in OWNED]
    if owned:
        raise OptionError("set", f"--set {','.join(owned)}: bench-quality sets the updates itself (--updates N)")
    ours = [f"max_update={updates}", f"validate_after_updates={updates}", "save_interval_updates=0"]
    return [*overrides, *ours, "no_save=false" if bleu else "no_save=true"]


def ratio(loss: float | None, reference: float | None) -> float | None:
    """loss / reference − 1 (+0.018 = 1.8% worse than sync), None when either is missing."""
    if loss is None or not reference:
        return None
    return loss / reference - 1


_OPTION = {
    "use_bmuf": re.compile(r"'use_bmuf': (True|False)"),
    "global_sync_iter": re.compile(r"'global_sync_iter': (\d+)"),
    "block_momentum": re.compile(r"'block_momentum': ([0-9.]+)"),
    "ddp_comm_hook": re.compile(r"'ddp_comm_hook': '?(\w+)'?"),
    "ddp_backend": re.compile(r"'ddp_backend': '(\w+)'"),
    "update_freq": re.compile(r"'update_freq': \[(\d+)\]"),
}


def logged_options(log_text: str) -> dict[str, object]:
    """The communication options fairseq logged at start-up (its config dump), as it read them."""
    out: dict[str, object] = {}
    for key, pattern in _OPTION.items():
        match = pattern.search(log_text)
        if match:
            value = match.group(1)
            out[key] = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    if "block_momentum" in out:
        out["block_momentum"] = float(out["block_momentum"])  # type: ignore[arg-type]
    return out


def samples_logged(log: logformat.Log) -> int | None:
    """Sentences trained, from the per-epoch `train` lines: Σ bsz × the epoch's updates. Exact when
    every update all-reduces its statistics (sync, fp16, update-freq); under BMUF rank 0 logs its own
    batch between syncs, so this undercounts there."""
    total, last = 0.0, 0
    for r in log.of("train"):
        bsz, update = r.get("bsz"), r.update
        if bsz is None or update is None:
            continue
        total += bsz * (update - last)
        last = update
    return round(total) if last else None


def loss_curve(log: logformat.Log) -> list[list[float]]:
    """[[update, training loss], ...] from the train_inner lines (rank 0's own between BMUF syncs)."""
    return [[r.update, r.get("loss")] for r in log.of("train_inner") if r.update and r.get("loss") is not None]


def result_from_log(entry: Entry, updates: int, log_text: str) -> dict:
    """What one run's rank-0 log says: final valid loss at the last update, samples, options, curve."""
    log = logformat.parse_log(log_text.splitlines())
    valid = [r for r in log.of("valid") if r.get("loss") is not None]
    final = valid[-1] if valid else None
    options = logged_options(log_text)
    strategy = strategies.parse(entry.comm)
    train = log.of("train")
    return {
        "strategy": entry.label, "comm": entry.comm, "update_freq": entry.update_freq, "updates": updates,
        "finished": log.finished, "devices": log.devices,
        "valid_loss": final.get("loss") if final else None,
        "valid_nll_loss": final.get("nll_loss") if final else None,
        "valid_ppl": final.get("ppl") if final else None,
        "valid_at_update": final.update if final else None,
        "validations": len(valid),
        "samples_logged": samples_logged(log), "epoch": train[-1].get("epoch") if train else None,
        "syncs_every": strategy.syncs_every,
        # the ranks hold one model when it validates: every update syncs, or the last update is a BMUF sync
        "synced_at_end": strategy.synced_at_end(updates, options),
        "fairseq_options": options, "curve": loss_curve(log),
        "params": logformat.logged_params(log_text),
    }


def with_samples_and_ratios(results: list[dict]) -> list[dict]:
    """Each result's `samples` (its log's count, or under BMUF the reference's: the same batches) and
    `ratio` of its valid loss to the reference's (the first result)."""
    ref = results[0] if results else None
    for r in results:
        bmuf = r.get("syncs_every", 1) > 1
        if bmuf and ref is not None and r.get("epoch") == ref.get("epoch"):
            r["samples"], r["samples_note"] = ref.get("samples_logged"), f"= {ref['strategy']}'s: the same batches"
        elif bmuf:
            r["samples"], r["samples_note"] = None, "rank 0 logs only its own batches between syncs"
        else:
            r["samples"], r["samples_note"] = r.get("samples_logged"), "logged"
        r["ratio"] = ratio(r.get("valid_loss"), ref.get("valid_loss") if ref else None)
    return results


def _f(value, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


def table(results: list[dict]) -> str:
    head = (f"{'strategy':<15} {'updates':>7} {'samples':>9} {'valid loss':>10} {'vs sync':>8} {'BLEU':>6} "
            f"{'MB/update':>9} {'wall(s)':>8} {'s/update':>8}")
    lines = [head]
    for r in results:
        vs = "(ref)" if r is results[0] else _f(r.get("ratio"), "+.1%")
        lines.append(f"{r['strategy']:<15} {r['updates']:>7} {_f(r.get('samples'), ','):>9} "
                     f"{_f(r.get('valid_loss'), '.3f'):>10} {vs:>8} {_f(r.get('bleu'), '.2f'):>6} "
                     f"{_f(r['tx_per_update'] / 1e6 if r.get('tx_per_update') is not None else None, '.2f'):>9} "
                     f"{_f(r.get('wall_s'), '.0f'):>8} {_f(r.get('s_per_update'), '.2f'):>8}")
    return "\n".join(lines)


def verdicts(results: list[dict], target: float = TARGET) -> list[str]:
    """One line per strategy against sync: within the target, or not, by how much."""
    lines = []
    for r in results[1:]:
        if r.get("ratio") is None:
            lines.append(f"{r['strategy']}: no valid loss to compare")
            continue
        within = r["ratio"] <= target
        lines.append(f"{r['strategy']}: valid loss {r['valid_loss']:.3f} vs sync's {results[0]['valid_loss']:.3f} "
                     f"({r['ratio']:+.1%}): {'within' if within else 'NOT within'} {target:.0%} of sync"
                     + (f" (synchronous for its first {r['sync_updates']} updates)" if r.get("sync_updates") else "")
                     + ("" if r.get("synced_at_end") else " (the ranks were NOT synced when it validated)"))
    return lines


def summary(report: dict) -> str:
    accumulated = any(r["update_freq"] > 1 for r in report["results"])
    head = (f"# {report['preset']}{' ' + ','.join(report['overrides']) if report['overrides'] else ''}: "
            f"{report['dataset']}, {report['ranks']} ranks on {report['n_hosts']} hosts, {report['updates']} updates "
            f"each{' (update-freq:K: N/K of K batches)' if accumulated else ''}, "
            f"validation at the end"
            + ("" if report["bleu_measured"] else "; BLEU not measured (--no-bleu)"))
    if report["updates"] != report["updates_asked"]:
        multiple = report.get("multiple_of") or math.lcm(*(r["syncs_every"] * r["update_freq"]
                                                           for r in report["results"]))
        head += (f"\n  ({report['updates_asked']} asked, rounded up to a multiple of {multiple} "
                 "so every run ends on a sync)")
    body = [head, table(report["results"]), *verdicts(report["results"])]
    ref = report["results"][0] if report["results"] else {}
    if ref.get("bleu") is not None and ref["bleu"] < UNTRAINED_BLEU:
        body.append(f"WARNING: the reference ({ref['strategy']}) did not learn to translate (BLEU {ref['bleu']:.2f}): "
                    "the ratios compare models that learned nothing yet; train longer (or lower the lr) first")
    if report.get("incomplete"):
        done = {r["strategy"] for r in report["results"]}
        missing = [s for s in report.get("strategies", []) if s not in done]
        body.append(f"INCOMPLETE: {report['incomplete']}"
                    + (f"; not measured: {', '.join(missing)}" if missing else ""))
    return "\n".join(body) + (f"\nJSON {report['path']}" if report.get("path") else "")


# ---- on the cluster ----


def wait_done(run: Run, hosts: list[Host], updates: int, timeout: float, say=print,
              poll: float = 3.0, every_s: float = 30.0) -> None:
    """Until rank 0's processes are gone (the run finished, or a rank died: the log says which)."""
    state_cmd = agent_command(hosts[0], "keeper.state", "--run", run.remote_dir, "--tail", 0)
    deadline = time.monotonic() + timeout
    said, last = time.monotonic(), None
    with connect(hosts[0]) as conn:
        while True:
            result = conn.run(state_cmd, hide=True, warn=True, in_stream=False)
            try:
                state = json.loads(result.stdout)
            except ValueError:
                state = {"running": True}  # a hiccup: ask again
            if not state.get("running"):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{run.run_id}: not finished after {timeout:.0f} s (update "
                                   f"{state.get('update')}/{updates})")
            if time.monotonic() - said >= every_s and state.get("update") != last:
                last = state.get("update")
                say(f"  {run.run_id}: update {last or 0}/{updates}")
                said = time.monotonic()
            time.sleep(poll)


def evaluate(run: Run, host: Host) -> tuple[float, float]:
    """BLEU of the final checkpoint on the test set, by `fab evaluate`'s command; (BLEU, seconds)."""
    cmd = command.evaluation_command(
        data_dir=run.data_dir, checkpoint=f"{run.remote_dir}/checkpoints/checkpoint_last.pt",
        reference=f"{run.data_dir}/test.ref.de", out_dir=f"{run.remote_dir}/eval",
        venv=venv_of(host), cpu=host.gpus == 0)
    t0 = time.monotonic()
    result = run_all([host], cmd)[host.name]
    if not result.ok:
        said = result.stderr if result.error is None else result.why
        raise ClusterError(f"{host.name}: evaluation of {run.run_id} failed: {said:.600}")
    return command.parse_bleu(result.stdout), time.monotonic() - t0


def stop_and_clean(run: Run, hosts: list[Host], started: bool, say=print, finished: bool = False) -> None:
    """Stop the run (train.run.launch.stop confirms no process is left) and remove its checkpoints,
    even on a second Ctrl-C or SIGTERM; said unless the run had finished. The logs stay, for a look
    afterwards."""
    if not started:
        return
    with signals_ignored():
        try:
            launch.stop(run, hosts)
        except ClusterError as err:
            say(f"could not stop {run.run_id}: {err}")
            raise
        run_all(hosts, f"rm -f {shlex.quote(run.remote_dir)}/checkpoints/*.pt")
        if not finished:
            say(f"stopped {run.run_id} on every host (no training process left)")


def run_one(hosts: list[Host], entry: Entry, n: int, stamp: str, preset: str, overrides: list[str],
            dataset: str, port: int, precision: str, bleu: bool, timeout: float, say=print) -> dict:
    """One fresh run of `entry` to its end: its result (valid loss, BLEU, wall time, ...)."""
    updates = entry.updates(n)
    run = Run(run_id=f"quality-{stamp}-{entry.slug}", hosts=[h.name for h in hosts], preset=preset,
                     overrides=run_overrides(overrides, updates, bleu), dataset=dataset, master_port=port,
                     update_freq=entry.update_freq, precision=precision, comm=entry.comm)
    try:
        run.resolved_preset()
        launch.host_commands(run, hosts)  # an option the strategy cannot run with (e.g. ddp_backend)
    except (presets.OverrideError, ValueError) as err:
        raise ClusterError(f"{entry.label}: {err}") from err
    started = finished = False
    with signals_raise():
        try:
            problems = preflight.check(run, hosts, preflight.probe(run, hosts))
            if problems:
                raise ClusterError("preflight failed:\n  " + "\n  ".join(problems))
            started = True
            before = tx_bytes(hosts)
            t0 = time.monotonic()
            launch.start(run, hosts)
            say(f"[{entry.label}] {run.run_id}: {updates} updates"
                + (f" of {entry.update_freq} batches" if entry.update_freq > 1 else ""))
            wait_done(run, hosts, updates, timeout, say)
            wall = time.monotonic() - t0
            after = tx_bytes(hosts)
            result = result_from_log(entry, updates, launch.read_log(hosts[0], run, lines=200000))
            if not result["finished"] or result["valid_loss"] is None or result["valid_at_update"] != updates:
                states = launch.states(run, hosts)
                raise ClusterError(f"{run.run_id} ended without its final validation at update {updates}: " + "; ".join(
                    f"{s.name}: {' | '.join(s.tail[-3:]) or s.error}" for s in states))
            sent = {name: after[name] - before[name] for name in after}
            result.update(run_id=run.run_id, wall_s=wall, s_per_update=wall / updates, tx_bytes=sent,
                          tx_per_update=sum(sent.values()) / len(sent) / updates,
                          sync_updates=strategies.parse(entry.comm).sync_updates(run.resolved_preset().options))
            if bleu:
                result["bleu"], result["bleu_s"] = evaluate(run, hosts[0])
            say(f"[{entry.label}] valid loss {result['valid_loss']:.3f} after {updates} updates, {wall:.0f} s"
                + (f", BLEU {result['bleu']:.2f}" if bleu else ""))
            finished = True
            return result
        finally:
            stop_and_clean(run, hosts, started, say, finished)


def bench_quality(hosts: list[Host], entries: list[Entry], updates: int = 300, preset: str = "tiny",
                  overrides: list[str] | None = None, dataset: str = "synthetic", port: int = 29500,
                  precision: str = "fp32", bleu: bool = True, timeout: float = 3600, say=print) -> dict:
    """Every entry trained in turn (the reference first); the report, written (also when a run failed:
    what finished, marked incomplete, and the error raised)."""
    require_cluster(hosts, precision, "bench-quality needs at least two hosts (what the ranks exchange is "
                                      "the point)")
    overrides = list(overrides or [])
    n = common_updates(updates, entries)
    for e in entries:  # every option checked before the first run starts
        try:
            presets.resolve(preset, run_overrides(overrides, e.updates(n), bleu))
        except presets.OverrideError as err:
            raise OptionError("set", err) from None
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if n != updates:
        say(f"{updates} updates rounded up to {n}: a multiple of every sync period and update-freq")
    results: list[dict] = []
    error: BaseException | None = None
    try:
        for e in entries:
            results.append(run_one(hosts, e, n, stamp, preset, overrides, dataset, port, precision, bleu, timeout,
                                   say))
    except BaseException as err:  # Ctrl-C too: what finished is still written
        error = err
    if not results:
        raise error  # type: ignore[misc]
    now = datetime.now(UTC)
    report = {"benchmark": "bench-quality", "timestamp": now.isoformat(timespec="seconds"),
              "hosts": [h.name for h in hosts], "n_hosts": len(hosts), "ranks": world_size(hosts),
              "preset": preset, "overrides": overrides, "dataset": dataset, "precision": precision,
              "updates_asked": updates, "updates": n, "multiple_of": math.lcm(*(e.period for e in entries)),
              "strategies": [e.label for e in entries], "reference": REFERENCE, "target": TARGET,
              "bleu_measured": bleu, "results": with_samples_and_ratios(results),
              "incomplete": f"{type(error).__name__}: {error}" if error else None}
    report["path"] = str(measurements.write(report, "quality", now))
    if error:
        say(summary(report))
        raise error
    return report


def run(hosts: list[Host], comm: str = DEFAULT_COMM, preset: str = "tiny", set_text: str | None = None,
        dataset: str = "synthetic", updates: int | str = 300, port: int | str = 29500, precision: str | None = None,
        bleu: bool = True, timeout: float | str = 3600, say=print) -> dict:
    """`fab bench-quality`: the benchmark from the task's option values as given (`comm` a comma
    list, `set_text` --set's `key=value,...`, numbers may come as text), every option checked before
    the first run; says the summary. `precision` None: as `fab train` picks it."""
    precision = precision or command.default_precision([h.gpus for h in hosts])
    try:
        entries = parse_entries(comm)
        common_updates(int(updates), entries)
    except ValueError as err:
        raise ClusterError(str(err)) from err
    report = bench_quality(hosts, entries, updates=int(updates), preset=preset,
                           overrides=presets.parse_overrides(set_text), dataset=dataset, port=int(port),
                           precision=precision, bleu=bool(bleu), timeout=float(timeout), say=say)
    say(summary(report))
    return report
