"""Every reason not to start, asked of every host in one round trip before anything starts.

`probe` runs train.agent.measure.probe on each host (versions, pinned packages, the agent's digest, GPUs,
the dataset's checksum, free disk, the rendezvous port); `check` turns the answers into problems,
each naming the host, the cause and the fix. Pure: answers in, problems out.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path

from ..agent.measure import pins
from ..agent.measure.probe import agent_digest, versions_differ
from ..cluster import TOP, ClusterError, Host, HostResult, run_all
from ..hosts.remote import agent_command, venv_of
from ..plan import batch as batch_model
from ..plan import batching
from ..recipe import strategies
from ..recipe.params import preset_params
from ..recipe.presets import Value
from ..recipe.record import Run
from . import disk


@functools.cache
def pinned() -> dict[str, str]:
    """What train_env installs on every host: requirements-train.txt's pins (read once)."""
    return pins.read_pins(TOP / "requirements-train.txt")


@functools.cache
def controller_agent() -> str:
    """This checkout's host-side agent, as train_env installs it on every host (hashed once)."""
    return agent_digest()


def answer(result: HostResult) -> dict | None:
    """The JSON object an agent module printed last, None when there is none."""
    lines = result.stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return said if isinstance(said, dict) else None


def probe(run: Run, hosts: list[Host]) -> dict[str, dict]:
    """Every host's answers to train.agent.measure.probe, in one round trip; an unreachable host raises,
    naming it and why."""
    # --cache: provisioning's record of the versions (torch, fairseq), valid while no package, Python or
    # driver changed: importing torch to ask again takes seconds on every host, at every start
    cache = f"{Path(venv_of(hosts[0])).parent}/versions.json"
    results = run_all(hosts, agent_command(hosts[0], "measure.probe", "--data", run.data_dir, "--port", run.master_port,
                                           "--run", run.remote_dir, "--packages", "--cache", cache))
    answers, problems = {}, []
    for host in hosts:
        result = results[host.name]
        if not result.reachable:
            problems.append(f"{host.name} ({host.address}): unreachable: {result.error}")
        elif (said := answer(result)) is None:
            problems.append(f"{host.name}: the training environment did not answer "
                            f"({venv_of(host)}/bin/python: {result.stderr.strip()[-300:]}); provision it first")
        else:
            answers[host.name] = said
    if problems:
        raise ClusterError("preflight failed:\n  " + "\n  ".join(problems))
    return answers


def _device(host: Host) -> str:
    if host.gpus > 0:
        return f"{host.gpus} GPU{'s' if host.gpus != 1 else ''} ({host.ranks} rank{'s' if host.ranks != 1 else ''})"
    return f"a CPU host with {host.ranks} rank{'s' if host.ranks != 1 else ''} (cpu_ranks)"


def layout_problems(hosts: list[Host], reference: str | None = None) -> list[str]:
    """Hosts that would run a different number of ranks, or on another kind of device, than the
    others: one problem each, naming the host, what it has and what to do. torchrun starts the same
    nproc_per_node on every host and numbers ranks node_rank × nproc_per_node + local_rank, which
    fairseq's world size and rank layout assume; a 1-GPU host beside 2-GPU hosts (a VM that shows
    1 of its 2 GPUs) would leave a rank number unused and hang the rendezvous, and a CPU host beside
    GPU hosts would train with gloo against NCCL. The reference is the host named `reference` (a
    rejoin: the run's current rank 0), else what most hosts have (on a tie, the most ranks: the
    smaller host is the likelier broken one). Pure: hosts in, problems out."""
    if len(hosts) < 2:
        return []
    try:
        shapes = [(h.gpus, h.ranks) for h in hosts]
    except ClusterError as err:  # a cpu_ranks that is no number
        return [str(err)]
    counts = {s: shapes.count(s) for s in shapes}
    named = [s for h, s in zip(hosts, shapes, strict=True) if h.name == reference]
    reference = named[0] if named else max(counts, key=lambda s: (counts[s], s[1], s[0]))
    like = [h.name for h, s in zip(hosts, shapes, strict=True) if s == reference]
    ref_host = next(h for h in hosts if h.name == like[0])
    problems = []
    for host, shape in zip(hosts, shapes, strict=True):
        if shape == reference:
            continue
        if host.gpus > 0 and ref_host.gpus > 0:
            fewest = min(host.gpus, ref_host.gpus)
            if host.gpus < ref_host.gpus:
                fix = (f"make {host.name} show all its GPUs to nvidia-smi (playbooks/gpu.yml checks it), train "
                       f"without it (--hosts {','.join(like)}), or set gpus: {fewest} on every host (that many "
                       "GPUs of each)")
            else:
                fix = (f"set gpus: {fewest} on {host.name} (that many of its GPUs), or train without it "
                       f"(--hosts {','.join(like)})")
        elif host.gpus == 0 and ref_host.gpus == 0:
            fix = f"set the same cpu_ranks on every host (cpu_ranks: {ref_host.ranks} in the inventory's vars)"
        else:
            fix = f"train on the {'GPU' if ref_host.gpus else 'CPU'} hosts alone (--hosts {','.join(like)})"
        problems.append(f"{host.name}: {_device(host)}, while {', '.join(like)} "
                        f"{'has' if len(like) == 1 else 'have'} {_device(ref_host)}: torchrun starts the same "
                        f"number of ranks on every host (fairseq's rank layout needs it); {fix}")
    return problems


def memory_problem(run: Run, host: str, gpus: list[dict], vocab: int = 32000,
                   options: Mapping[str, Value] | None = None) -> str | None:
    """Why the run's max_tokens would not fit `host`'s smallest GPU (the memory model with its
    margin, train.plan.batch), or None. `options`: the run's preset's, already resolved."""
    if not gpus:
        return None
    options = options if options is not None else run.resolved_preset().options
    if not options.get("max_tokens"):
        return None
    smallest = min(gpus, key=lambda g: g["memory_mib"])
    gib, max_tokens = smallest["memory_mib"] / 1024, int(options["max_tokens"])  # type: ignore[call-overload]
    extra = strategies.parse(run.comm).extra_bytes_per_param(options)
    if batch_model.fits(options, vocab, max_tokens, gib, run.precision, extra):
        return None
    peak = batch_model.peak_gib(options, vocab, max_tokens, run.precision, extra)
    largest = batch_model.largest_max_tokens(options, vocab, gib, run.precision, extra_per_param=extra)
    comm = (f" (--comm {run.comm} keeps {extra} B a parameter beside the model: "
            f"{preset_params(options, vocab) * extra / 2**30:.1f} GiB of it)" if extra else "")
    fix = (f"lower max_tokens to {largest:,} or less (`--set max_tokens=`), or leave it to tandem (the preset's "
           "tokens per update, derived for the GPUs)" if largest else "the model alone does not fit")
    return (f"{host}: max_tokens {max_tokens:,} is predicted to need {peak:.1f} GiB of GPU memory{comm} "
            f"({peak * batch_model.MARGIN:.1f} with the model's {batch_model.MARGIN:.2f}x margin), and its "
            f"{smallest['name']} has {gib:.1f} GiB: {fix}")


def check(run: Run, hosts: list[Host], answers: dict[str, dict],
          pins_wanted: dict[str, str] | None = None, agent: str | None = None,
          reference: str | None = None, adopting: bool = False, need: disk.DiskNeed | None = None) -> list[str]:
    """Every reason not to start, each naming the host and the cause. Pure: answers in, problems out.
    `pins_wanted`: the training environment's pins (default: requirements-train.txt); `agent`: the
    agent's digest hosts must answer (default: this checkout's); `adopting`: the run's keepers run and
    take the new start (`--replace`), so its ranks training now are no reason to refuse; `reference`:
    the host whose ranks the others must match (layout_problems; default: what most hosts have); `need`:
    what the run writes on each host (default: its preset's, train.run.disk; fab train's start has it)."""
    pins_wanted = pinned() if pins_wanted is None else pins_wanted
    agent = controller_agent() if agent is None else agent
    problems = layout_problems(hosts, reference)
    first = hosts[0].name
    options = run.resolved_preset().options  # the batch as the probe's GPU memory derived it
    need = need or disk.run_need(options, batching.VOCAB, offsite=bool(run.checkpoints_to))
    for host in hosts:
        a = answers[host.name]
        if a.get("agent") != agent:
            found = f"version {a['agent'][:12]}" if a.get("agent") else "one older than this check"
            problems.append(f"{host.name}: tandem's host-side agent (train/agent) there is {found}, not this "
                            f"controller's {agent[:12]}: re-run provision.yml (--tags train_env) to install it")
        if "packages" in a and (drifted := pins.drift(pins_wanted, a["packages"])):  # often why an import fails
            problems.append(f"{host.name}: packages differ from the pins: {', '.join(drifted)}; "
                            "re-run provision.yml (--tags train_env) to restore them")
        if "import_error" in a:
            problems.append(f"{host.name}: torch/fairseq do not import: {a['import_error']}")
            continue
        if a.get("cuda_devices", 0) != host.gpus and host.gpus > 0:
            problems.append(f"{host.name}: expected {host.gpus} GPUs, torch sees {a.get('cuda_devices')}")
        if host.gpus > 0 and "gpu_error" in a:  # its memory unknown, the batch would be sized by the others'
            problems.append(f"{host.name}: NVML could not read its GPUs ({a['gpu_error']}): check the driver "
                            "(`nvidia-smi` there); re-run provision.yml --tags nvidia_driver")
        elif host.gpus > 0 and (too_big := memory_problem(run, host.name, a.get("gpus") or [], options=options)):
            problems.append(too_big)
        if a.get("data") is None:
            problems.append(f"{host.name}: no dataset at {run.data_dir}: run `fab prepare-data`")
        elif a["data"] != answers[first].get("data"):
            problems.append(f"{host.name}: dataset {run.data_dir} differs from {first}'s (checksums): "
                            "run `fab prepare-data` again")
        if "free_gb" in a and (full := disk.problem(host.name, need, a["free_gb"], a.get("run_gb") or 0.0)):
            problems.append(full)
        if a.get("running") and not adopting:  # adopting: the running keepers take the new start
            problems.append(f"{host.name}: run {run.run_id} is already training there (pid {a['running']}): "
                            "`fab stop` first, or `fab status`")
        elif host.name == first and not a.get("port_free") and not (adopting and a.get("running")):
            problems.append(f"{host.name}: rendezvous port {run.master_port} is in use ({a.get('port_error')}): "
                            "stop what holds it or pick another with --port")
    importable = {h.name: answers[h.name] for h in hosts if "import_error" not in answers[h.name]}
    problems += [f"{line}: mismatched versions break distributed init; re-run provision.yml"
                 for line in versions_differ(importable)]
    return problems


