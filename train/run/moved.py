"""`fab train --resume-from URL --hosts NEW`: a run whose VMs are all gone goes on on other VMs from
its newest whole copy off the cluster (train.agent.offsite.copies wrote it, the old hosts' keepers).

Rank 0's new host reads the store with its own credentials and fetches the copy straight into the
run's directory (the GB checkpoint never passes through the controller, which may hold no credentials
at all); the copy's run.json is the run's record (preset, dataset, overrides, strategy, history), so
a controller that never saw the run can resume it. The batch is derived again for the new world
(tokens per update kept: train.plan.batching), the link measured again, the data prepared on the new
hosts where it is missing; then the start is an ordinary resume: the keepers copy the checkpoint to
the other hosts over the cluster network.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import fields

from ..cluster import ClusterError, Host, run_all
from ..errors import OptionError
from ..hosts.remote import agent_command
from ..plan import batching
from ..recipe.record import NAME, NAMED, Run, check_record
from .elastic import scaled_update_freq
from .offsite import ago, store_url

REMAKEABLE = {"synthetic": False, "wmt16": True}  # datasets prepare-data makes again from their name alone (wmt16?)
DERIVED_AGAIN = ("max_tokens", "max_tokens_cap", "save_interval_updates", "gpu_name", "link_mbps")
FETCH_TIMEOUT_S = 3600  # a GB checkpoint from a bucket in another region


def _on(host: Host, command: str, timeout: float) -> dict | None:
    """Run an offsite command on `host`; its JSON answer. ClusterError naming the host when it fails."""
    result = run_all([host], command, timeout=timeout)[host.name]
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("error"):
        raise ClusterError(f"{host.name}: {answer['error']}")
    if not result.ok:
        raise ClusterError(f"{host.name}: {result.why}")
    return answer


class WhichRun(OptionError):
    """--resume-from's store holds several runs and --run named none: each listed, one a line (exit 2)."""

    def __init__(self, text: str):
        ValueError.__init__(self, text)
        self.option = "--resume-from"


def runs_held(host: Host, url: str) -> list[dict]:
    """Each run's newest whole copy under `url` (or the copy `url` is), as rank 0's new host finds it."""
    return _on(host, agent_command(host, "offsite.upload", "runs", url), timeout=300) or []


def listing(found: list[dict], now: float) -> str:
    """One line a run: its name, newest update, age, preset, dataset and hosts (what a user knows it by)."""
    return "\n".join(f"  {_shown(r['run'])}: update {r['update']:,}, {ago(now - float(r.get('time') or now))} old, "
                     f"{_shown(r.get('preset') or 'preset not recorded')}, "
                     f"{_shown(r.get('dataset') or 'dataset not recorded')}, "
                     f"hosts {','.join(map(_shown, r.get('hosts') or [])) or 'not recorded'}" for r in found)


def _shown(value: object) -> str:
    """A name from the store as said: as it is when a plain name, else quoted (whoever writes the store wrote it)."""
    return value if isinstance(value, str) and NAME.fullmatch(value.replace(" ", "_")) else repr(value)[:80]


def which_run(found: list[dict], run_id: str | None, url: str) -> dict:
    """The run to resume: the one --run names, the only one there; never a guess among several."""
    now = time.time()
    if run_id and not any(r.get("run") == run_id for r in found):
        _none(f"{url} holds no whole copy of {run_id}", found, now)
    if run_id:
        found = [r for r in found if r.get("run") == run_id]
    elif len(found) > 1:
        raise WhichRun(f"--resume-from: {url} holds copies of {len(found)} runs: name one with --run RUN (or give "
                       f"its copy's folder, URL/RUN/uN):\n{listing(found, now)}")
    elif not found:
        _none(f"{url} holds no whole copy of any run", found, now)
    chosen = found[0]
    if not isinstance(chosen.get("run"), str) or not NAME.fullmatch(chosen["run"]):  # the hosts' run directory
        raise ClusterError(f"{url}: the newest copy refused: its run expected {NAMED}, found {chosen.get('run')!r}")
    return chosen


def _none(what: str, found: list[dict], now: float):
    there = f"; it holds:\n{listing(found, now)}" if found else \
        " (a copy counts once its manifest.json is written beside its files): check the URL"
    raise ClusterError(what + there)


def same_model(facts: dict, asked: dict | None, where: str) -> None:
    """A copy of another preset or dataset than the options asked for is refused, both named (exit 2)."""
    for option, want in (asked or {}).items():
        if want and facts.get(option) and facts[option] != want:
            raise OptionError(option, f"{want} asked, but {facts.get('run')}'s copy at {where} trained "
                              f"{option} {facts[option]}: resume it without --{option}, or name the run that "
                              f"trained {want} (--run)")


def adopted(record: dict, hosts: list[Host], copy: dict, url: str) -> Run:
    """The run's record from its copy, on `hosts`: what was derived for the old world is derived again."""
    # read as user input: whoever can write the bucket's prefix writes this record
    check_record(record, f"{copy['where']}/run.json", copy["run"])
    known = {f.name for f in fields(Run)}
    run = Run(**{k: v for k, v in record.items() if k in known})
    old, old_ranks = list(run.hosts), len(run.hosts) * run.ranks_per_host
    names = [h.name for h in hosts]
    run.hosts, run.order, run.ranks_per_host = names, names, hosts[0].ranks
    ranks = len(names) * run.ranks_per_host  # tokens per update kept on another number of ranks, as elastic does
    run.update_freq = batching.update_freq_for(run, ranks, scaled_update_freq(run.update_freq, old_ranks, ranks))
    for name in DERIVED_AGAIN:  # the batch of a run with a target: derived again with the new GPUs' memory
        setattr(run, name, None)
    run.members = [*run.members, {"hosts": names, "from_update": copy["update"], "time": time.time(),
                                  "why": f"moved to {', '.join(names)} from {url} at update {copy['update']}",
                                  "joined": [n for n in names if n not in old],
                                  "lost": [n for n in old if n not in names]}]
    return run


def adopt(url: str, run_id: str | None, hosts: list[Host], console, asked: dict | None = None) -> tuple[Run, dict]:
    """Find the run's newest whole copy (the one --run names, or the only run there; `asked`: the preset
    and dataset the options named), fetch it onto rank 0's new host with every sha256 checked there (a
    copy that fails it said, and the next whole one taken), and record the run here on `hosts`. Returns
    the run and the copy's manifest."""
    if not url:
        raise OptionError("resume-from", "expected a store URL (s3://BUCKET/PREFIX, gs://..., a directory, sftp://...)")
    url = store_url(url)
    rank0 = hosts[0]
    with console.status(f"{rank0.name}: looking for the runs' copies under {url}"):
        chosen = which_run(runs_held(rank0, url), run_id, url)
    same_model(chosen, asked, chosen.get("where") or url)
    name = chosen["run"]
    age = time.time() - float(chosen.get("time") or time.time())
    console.print(f"newest copy: {name} at update {chosen['update']:,} ({ago(age)} old), {chosen['where']}",
                  markup=False)
    remote_dir = Run(run_id=name, hosts=[], preset="", overrides=[], dataset="").remote_dir
    into = f"{remote_dir}/checkpoints"
    held = run_all(hosts, f"test -e {shlex.quote(into + '/checkpoint_last.pt')}", timeout=60)
    if holders := [h for h, r in held.items() if r.ok]:  # never overwritten by an older copy from the store
        raise ClusterError(f"{', '.join(holders)} already hold{'s' if len(holders) == 1 else ''} a checkpoint of "
                           f"{name} ({into}): these hosts are not fresh; resume it there with `fab train "
                           f"--run {name}` (its keepers go on from the newest any host holds)")
    started = time.monotonic()
    pinned = ["--update", str(chosen["pinned"])] if chosen.get("pinned") is not None else []
    with console.status(f"{rank0.name}: fetching {name}'s newest whole copy (every sha256 checked; at most "
                        f"{FETCH_TIMEOUT_S // 60} min)"):
        copy = _on(rank0, agent_command(rank0, "offsite.upload", "fetch", chosen["store"], name, into, *pinned),
                   timeout=FETCH_TIMEOUT_S)
    for why in copy.get("refused") or []:
        console.print(f"refused, not whole: {why}", markup=False)
    if copy["update"] != chosen["update"]:
        console.print(f"{name} resumes from its next whole copy: update {copy['update']:,}, {copy['where']}",
                      markup=False)
    took = time.monotonic() - started
    size = sum(int(f.get("size") or 0) for f in (copy.get("files") or {}).values())
    console.print(f"{rank0.name} fetched {size / 1e9:.2f} GB in {took:.0f} s ({size / 1e6 / max(took, 1e-3):.0f} MB/s)",
                  markup=False)
    record_path = shlex.quote(f"{into}/run.json")
    read = run_all([rank0], f"cat {record_path} && rm -f {record_path}", timeout=60)[rank0.name]
    if not read.ok:
        raise ClusterError(f"{rank0.name}: the copy's run.json could not be read: {read.why}")
    try:
        held = json.loads(read.stdout)
    except ValueError:
        held = read.stdout[:80]  # refused by adopted, as found
    run = adopted(held, hosts, copy, url)
    same_model({"run": name, "preset": run.preset, "dataset": run.dataset}, asked, f"{copy['where']}/run.json")
    run.save()
    console.print(f"{run.run_id} moved to {', '.join(run.hosts)}: checkpoint of update {copy['update']:,} on "
                  f"{rank0.name} (the keepers copy it to the others); the batch is derived again for "
                  f"{len(hosts) * hosts[0].ranks} ranks", markup=False)
    return run, copy


def data_on(run: Run, hosts: list[Host], console) -> None:
    """The run's dataset on the new hosts: prepared there where it is missing (a dataset made from its
    name alone), then checked to be the one the run trained on (its manifest's checksum, when the run
    recorded it): other subwords would load the checkpoint into another vocabulary."""
    manifest = shlex.quote(f"{run.data_dir}/MANIFEST.sha256")
    held = run_all(hosts, f"sha256sum {manifest} | cut -d' ' -f1", timeout=60)
    missing = [name for name, r in held.items() if not r.ok or not r.stdout.strip()]
    if missing and run.dataset not in REMAKEABLE:
        raise ClusterError(f"{', '.join(missing)}: no dataset {run.dataset} at {run.data_dir}: prepare it there as "
                           f"it was made (`fab prepare-data --hosts {','.join(h.name for h in hosts)} --name "
                           f"{run.dataset} --source DIR`), then this command again")
    if missing:
        from ..data.prepare import prepare_data  # the corpus code: only when a dataset is made

        console.print(f"{', '.join(missing)}: no {run.dataset} yet: preparing it for the moved run")
        prepare_data(hosts, console, name=run.dataset, wmt16=REMAKEABLE[run.dataset])
        held = run_all(hosts[:1], f"sha256sum {manifest} | cut -d' ' -f1", timeout=60)
    now = held[hosts[0].name].stdout.strip()
    if run.data_manifest and now != run.data_manifest:
        raise ClusterError(f"{hosts[0].name}: {run.data_dir} is not the dataset {run.run_id} trained on (manifest "
                           f"{now[:12]}, the run's {run.data_manifest[:12]}): prepare it with the options it was "
                           "made with (fab prepare-data --vocab-size/--lines/--source), then this command again")


def rest_of(run_id: str | None) -> tuple[dict, str]:
    """`fab predict --run RUN`: the options that price what is left of a run (its preset, overrides,
    dataset and strategy; the updates from its newest known one to its max_update), and a line saying so."""
    run = Run.load(run_id)
    done = max([int(m.get("from_update") or 0) for m in run.members] or [0])
    if not run.max_update:
        raise ClusterError(f"{run.run_id} has no max_update to price the rest of: --set max_update=N")
    left = max(1, run.max_update - done)
    options = {"preset": run.preset, "set_text": ",".join(o for o in run.overrides if not o.startswith("max_update=")),
               "dataset": run.dataset, "comm": run.comm, "max_update": left}
    return options, (f"the rest of {run.run_id}: {left:,} updates (from update {done:,} of {run.max_update:,}), "
                     f"{run.preset} with --comm {run.comm}")
