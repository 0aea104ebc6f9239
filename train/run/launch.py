"""Runs on the cluster: preflight, start, follow, status, stop, resume.

A run has an id. On every host its files live in /data/tandem/runs/<id>/ (train.log,
train.pid, checkpoints/, tensorboard/); on the controller in reports/<id>/ (run.json, the
off-host copy of the last and best checkpoints, collected logs). `train.run.command` builds
each host's command; this module only moves it, and files, between machines.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..agent import pins
from ..agent.probe import agent_digest, versions_differ
from ..cluster import TOP, TRANSFER_STALL_S, ClusterError, Host, connect, get_whole, on_each, run_all
from ..report import logparse
from . import command, presets

DATA_ROOT = "/data/tandem/datasets"
RUNS_ROOT = "/data/tandem/runs"
REPORTS = TOP / "reports"
DEFAULT_VENV = "/opt/tandem/venv"
PINS = pins.read_pins(TOP / "requirements-train.txt")  # what train_env installs on every host
AGENT = agent_digest()  # this checkout's host-side agent, as train_env installs it on every host


def venv_of(host: Host) -> str:
    return str(host.vars.get("train_env_venv", DEFAULT_VENV))


@dataclass
class Run:
    """What the controller remembers of a run (reports/<id>/run.json)."""

    run_id: str
    hosts: list[str]
    preset: str
    overrides: list[str]
    dataset: str
    master_port: int = 29500
    update_freq: int = 1
    precision: str = "fp32"
    comm: str = "sync"  # train.run.comm.Strategy, `auto` already resolved
    link_mbps: float | None = None  # the cluster link as measured when the run started
    members: list[dict] = field(default_factory=list)  # which hosts from which update (train.run.elastic)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def remote_dir(self) -> str:
        return f"{RUNS_ROOT}/{self.run_id}"

    @property
    def data_dir(self) -> str:
        return f"{DATA_ROOT}/{self.dataset}"

    @property
    def local_dir(self) -> Path:
        return REPORTS / self.run_id

    def hosts_of(self, hosts: list[Host]) -> list[Host]:
        """Those of `hosts` this run ran on, in rank order (rank 0 first)."""
        by_name = {h.name: h for h in hosts}
        chosen = [by_name[n] for n in self.hosts if n in by_name]
        if not chosen:
            raise ClusterError(f"run {self.run_id} ran on {', '.join(self.hosts)}; none of them is among "
                               f"{', '.join(by_name) or 'the hosts given'}")
        return chosen

    def resolved_preset(self) -> presets.Preset:
        return presets.resolve(self.preset, self.overrides)

    @property
    def max_update(self) -> int | None:
        value = self.resolved_preset().options.get("max_update")
        return int(value) if value else None

    def save(self) -> None:
        self.local_dir.mkdir(parents=True, exist_ok=True)
        (self.local_dir / "run.json").write_text(json.dumps(asdict(self), indent=2))
        latest = REPORTS / "latest"
        latest.unlink(missing_ok=True)
        latest.symlink_to(self.run_id)

    @classmethod
    def load(cls, run_id: str | None) -> Run:
        path = REPORTS / (run_id or "latest") / "run.json"
        if not path.exists():
            raise ClusterError(f"no run {run_id or '(latest)'} on this controller: start one with `fab train`")
        return cls(**json.loads(path.read_text()))


def new_run_id() -> str:
    return datetime.now().strftime("run-%Y%m%d-%H%M%S")


def train_threads(host: Host) -> int | None:
    """The inventory's `train_threads` for this host (None: torch's default)."""
    value = host.vars.get("train_threads")
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
        raise ClusterError(f"{host.name}: train_threads must be a whole number of CPU threads per rank (1 or more), "
                           f"the inventory gives {value!r}")
    return int(value)


def launches_for(run: Run, hosts: list[Host]) -> list[command.Launch]:
    return command.launches(
        run.run_id,
        [{"address": h.cluster_address, "gpus": h.gpus, "nic": h.nic or "", "threads": train_threads(h)}
         for h in hosts],
        master_port=run.master_port, data_dir=run.data_dir, run_dir=run.remote_dir,
        venv=venv_of(hosts[0]), update_freq=run.update_freq, precision=run.precision, comm=run.comm,
    )


def host_commands(run: Run, hosts: list[Host]) -> dict[str, str]:
    """Each host's exact training command: what `--dry-run` prints and `start` runs."""
    preset = run.resolved_preset()
    pairs = zip(hosts, launches_for(run, hosts), strict=True)
    return {h.name: command.training_command(preset, launch) for h, launch in pairs}


def agent_command(host: Host, module: str, *args: object) -> str:
    """The shell line that runs a host-side agent module (train/agent/, installed by roles/train_env)."""
    return shlex.join([f"{venv_of(host)}/bin/python", "-m", f"train.agent.{module}", *map(str, args)])


def _answer(result: object) -> dict | None:
    """The JSON object an agent module printed last, None when there is none."""
    lines = (getattr(result, "stdout", "") or "").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def probe(run: Run, hosts: list[Host]) -> dict[str, dict]:
    """Every host's answers to train.agent.probe, in one round trip; an unreachable host raises,
    naming it and why."""
    results = run_all(hosts, agent_command(hosts[0], "probe", "--data", run.data_dir, "--port", run.master_port,
                                           "--run", run.remote_dir, "--packages"))
    answers, problems = {}, []
    for host in hosts:
        result = results[host.name]
        if isinstance(result, Exception):
            problems.append(f"{host.name} ({host.address}): unreachable: {result}")
        elif (answer := _answer(result)) is None:
            problems.append(f"{host.name}: the training environment did not answer "
                            f"({venv_of(host)}/bin/python: {result.stderr.strip()[-300:]}); provision it first")
        else:
            answers[host.name] = answer
    if problems:
        raise ClusterError("preflight failed:\n  " + "\n  ".join(problems))
    return answers


def check(run: Run, hosts: list[Host], answers: dict[str, dict], min_free_gb: float = 1.0,
          pinned: dict[str, str] | None = None) -> list[str]:
    """Every reason not to start, each naming the host and the cause. Pure: answers in, problems out.
    `pinned`: the training environment's pins (default: requirements-train.txt)."""
    pinned = PINS if pinned is None else pinned
    problems = []
    first = hosts[0].name
    for host in hosts:
        a = answers[host.name]
        if a.get("agent") != AGENT:
            found = f"version {a['agent'][:12]}" if a.get("agent") else "one older than this check"
            problems.append(f"{host.name}: tandem's host-side agent (train/agent) there is {found}, not this "
                            f"controller's {AGENT[:12]}: re-run provision.yml (--tags train_env) to install it")
        if "packages" in a and (drifted := pins.drift(pinned, a["packages"])):  # often why an import fails
            problems.append(f"{host.name}: packages differ from the pins: {', '.join(drifted)}; "
                            "re-run provision.yml (--tags train_env) to restore them")
        if "import_error" in a:
            problems.append(f"{host.name}: torch/fairseq do not import: {a['import_error']}")
            continue
        if a.get("cuda_devices", 0) != host.gpus and host.gpus > 0:
            problems.append(f"{host.name}: expected {host.gpus} GPUs, torch sees {a.get('cuda_devices')}")
        if a.get("data") is None:
            problems.append(f"{host.name}: no dataset at {run.data_dir}: run `fab prepare-data`")
        elif a["data"] != answers[first].get("data"):
            problems.append(f"{host.name}: dataset {run.data_dir} differs from {first}'s (checksums): "
                            "run `fab prepare-data` again")
        if a.get("free_gb", 0) < min_free_gb:
            problems.append(f"{host.name}: {a.get('free_gb')} GB free on /data, need {min_free_gb} GB")
        if a.get("running"):
            problems.append(f"{host.name}: run {run.run_id} is already training there (pid {a['running']}): "
                            "`fab stop` first, or `fab status`")
        elif host.name == first and not a.get("port_free"):
            problems.append(f"{host.name}: rendezvous port {run.master_port} is in use ({a.get('port_error')}): "
                            "stop what holds it or pick another with --port")
    importable = {h.name: answers[h.name] for h in hosts if "import_error" not in answers[h.name]}
    problems += [f"{line}: mismatched versions break distributed init; re-run provision.yml"
                 for line in versions_differ(importable)]
    return problems


CHECKPOINTS = ["checkpoint_last.pt", "checkpoint_best.pt"]


def fetch_checkpoints(source: Host, save_dir: str, local: Path, tries: int = 3) -> list[str]:
    """Copy rank 0's checkpoints to the controller, each only when it changed there (size, mtime):
    following a run backs up every 30 s, and a big preset's checkpoint is GBs on the link being
    trained over. fairseq rewrites checkpoint_last.pt in place at every save, so a copy is kept
    only if the file did not change while it was read (else it is read again). Returns the names
    copied."""
    fetched = []
    with connect(source) as conn:

        def stat(name: str):
            result = conn.run(f"stat -c '%s %y' {save_dir}/{name}", warn=True, hide=True, in_stream=False,
                              timeout=30)
            return result.stdout.strip() if result.ok else None

        for name in CHECKPOINTS:
            before, stamp = stat(name), local / f".{name}.remote-stat"
            if before is None or ((local / name).exists() and stamp.exists() and stamp.read_text() == before):
                continue
            candidate = local / f".{name}.fetched"
            try:  # a try that fails (the host lost) leaves no GB-sized candidate behind
                for _ in range(tries):
                    get_whole(conn, f"{save_dir}/{name}", str(candidate))
                    after = stat(name)
                    if after == before:
                        break
                    before = after  # saved again while it was read: read the new one
                else:
                    raise ClusterError(f"{source.name}: {save_dir}/{name} changed during each of {tries} copies "
                                       "(saved faster than it copies); the controller keeps its previous copy")
                os.replace(candidate, local / name)
            finally:
                candidate.unlink(missing_ok=True)
            stamp.write_text(before)
            fetched.append(name)
    return fetched


def upload_checkpoints(hosts: list[Host], save_dir: str, local: Path, names: list[str], fresh: list[str]) -> None:
    """The controller's copies onto every host given, where missing, different in size, or `fresh`."""

    def upload(host: Host, conn) -> None:
        conn.run(f"mkdir -p {save_dir}", hide=True, in_stream=False)
        for name in names:
            there = conn.run(f"stat -c %s {save_dir}/{name}", warn=True, hide=True, in_stream=False)
            if name in fresh or not there.ok or int(there.stdout) != (local / name).stat().st_size:
                conn.put(str(local / name), f"{save_dir}/{name}")

    failed = {n: r for n, r in on_each(hosts, upload).items() if isinstance(r, Exception)}
    if failed:
        raise ClusterError("could not share the checkpoint: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))


CLUSTER_KEY = "$HOME/.ssh/tandem_cluster"  # roles/common/tasks/cluster_key.yml


def cluster_address(host: Host) -> str:
    """Where the other hosts reach this one (Host.cluster_address: the inventory's
    `cluster_address`, else the address tandem connects to)."""
    return host.cluster_address


def push_command(save_dir: str, peers: list[Host]) -> str:
    """The shell line, run on the host that has the checkpoints, that copies them to every peer
    over the cluster network at once (rsync: only what changed, into a temporary name, then
    renamed, so a peer never holds half a checkpoint). It prints `PEER rc` per peer."""
    names = " ".join(shlex.quote(f"{save_dir}/{n}") for n in CHECKPOINTS)
    ssh = (f'"ssh -i {CLUSTER_KEY} -o BatchMode=yes -o ConnectTimeout=10'
           ' -o ServerAliveInterval=10 -o ServerAliveCountMax=3"')  # the shell expands $HOME
    pushes = []
    for peer in peers:
        target = f"{peer.user}@{cluster_address(peer)}:{save_dir}/"
        rsync = f"rsync -a --timeout={TRANSFER_STALL_S} --rsync-path={shlex.quote(f'mkdir -p {save_dir} && rsync')}"
        # rsync exits 23/24 when fairseq rewrites or replaces a checkpoint while it is read: try again
        pushes.append(f"{{ for try in 1 2 3; do {rsync} -e {ssh} "
                      f"$files {shlex.quote(target)} >/dev/null 2>/tmp/tandem-push-{peer.name}.err; rc=$?; "
                      f"[ $rc = 23 ] || [ $rc = 24 ] || break; sleep 2; done; "
                      f"echo {peer.name} $rc $(tail -c 300 /tmp/tandem-push-{peer.name}.err | tr '\\n' ' '); }} &")
    return (f'test -f "{CLUSTER_KEY}" || {{ echo no-cluster-key; exit 3; }}; '

            f"files=$(ls {names} 2>/dev/null); " + " ".join(pushes) + " wait")


def push_between_hosts(source: Host, peers: list[Host], save_dir: str) -> None:
    """Copy `source`'s checkpoints to `peers` host to host (the cluster network, not through the
    controller). ClusterError naming each peer that failed; LookupError where `source` has no
    cluster key (provisioned before tandem made one)."""
    with connect(source) as conn:
        result = conn.run(push_command(save_dir, peers), warn=True, hide=True, in_stream=False)
    if "no-cluster-key" in result.stdout:
        raise LookupError(f"{source.name} has no cluster key ({CLUSTER_KEY}): re-run provisioning")
    answers = {line.split(" ", 1)[0]: line for line in result.stdout.splitlines() if line.strip()}
    failed = [answers.get(p.name, f"{p.name} (no answer)") for p in peers
              if answers.get(p.name, "").split(" ")[1:2] != ["0"]]
    if failed:
        raise ClusterError(f"copying checkpoints from {source.name} failed for: " + "; ".join(failed))


def share_checkpoint(run: Run, hosts: list[Host]) -> Path | None:
    """Make rank 0's checkpoint_last.pt (and best) available on every host and on the
    controller: fairseq saves on rank 0 only, and at a resume a rank that finds no
    checkpoint skips the broadcast and deadlocks. The hosts get it from each other over the
    cluster network; the controller keeps one copy (the backup when rank 0's host is lost), and
    hands it out where no host has one. Returns the controller's copy of the last."""
    save_dir = f"{run.remote_dir}/checkpoints"
    local = run.local_dir / "checkpoints"
    local.mkdir(parents=True, exist_ok=True)
    have = run_all(hosts, f"ls {save_dir}/checkpoint_last.pt 2>/dev/null", timeout=30)
    source = next((h for h in hosts if not isinstance(have[h.name], Exception) and have[h.name].ok
                   and have[h.name].stdout.strip()), None)
    peers = [h for h in hosts if h is not source]
    pushed = False
    if source is not None and peers:
        try:
            push_between_hosts(source, peers, save_dir)
            pushed = True
        except LookupError:
            pass  # the controller hands it out below
    fetched = fetch_checkpoints(source, save_dir, local) if source is not None else []
    backups = [n for n in CHECKPOINTS if (local / n).exists()]
    if source is None and not backups:
        return None
    if not pushed:
        upload_checkpoints(peers, save_dir, local, backups, fetched)
    return local / "checkpoint_last.pt"


def checkpoint_update(path: Path) -> int | None:
    import os

    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    return int(state.get("optimizer_history", [{}])[-1].get("num_updates", 0))


def start(run: Run, hosts: list[Host]) -> None:
    commands = host_commands(run, hosts)
    results = on_each(hosts, lambda h, c: c.run(commands[h.name], hide=True, in_stream=False, warn=True))
    problems = [f"{n}: {r}" if isinstance(r, Exception) else f"{n}: {r.stderr.strip()}"
                for n, r in results.items() if isinstance(r, Exception) or not r.ok]
    if problems:
        stop(run, hosts)
        raise ClusterError("could not start every rank (the others were stopped):\n  " + "\n  ".join(problems))


def read_log(host: Host, run: Run, lines: int = 5000) -> str:
    with connect(host) as conn:
        result = conn.run(f"tail -n {lines} {run.remote_dir}/train.log 2>/dev/null", hide=True, warn=True,
                          in_stream=False)
    return result.stdout


@dataclass
class HostState:
    name: str
    running: bool
    reachable: bool
    progress: logparse.Progress | None
    tail: list[str]
    error: str | None = None
    ended: logparse.RankEnd | None = None  # torchrun's word on a rank that failed
    stopped_by_user: bool = False  # `fab stop` ended it (train.agent.stop's mark)

    def describe(self, finished: bool) -> str:
        """This rank's state in a word or three: running, finished, stopped by fab stop, died: how."""
        if not self.reachable:
            return "unreachable"
        if self.running:
            return "running"
        if finished:
            return "finished"
        if self.stopped_by_user:
            return "stopped by fab stop"
        return f"died: {self.ended.how}" if self.ended else "stopped"


def states(run: Run, hosts: list[Host]) -> list[HostState]:
    """Each host's train.agent.state: its processes alive?, and its log's last lines parsed."""
    # a host whose sshd answers but hangs (frozen VM) must not hold up `fab status`: 15 s at most
    results = run_all(hosts, agent_command(hosts[0], "state", "--run", run.remote_dir, "--tail", 400), timeout=15)
    out = []
    for host in hosts:
        result = results[host.name]
        answer = None if isinstance(result, Exception) else _answer(result)
        if answer is None:
            why = result if isinstance(result, Exception) else f"no answer: {result.stderr.strip()[-300:]}"
            out.append(HostState(host.name, False, not isinstance(result, Exception), None, [], error=str(why)))
            continue
        log = answer["tail"]
        prog = logparse.progress(logparse.parse_log(log), run.max_update) if log else None
        out.append(HostState(host.name, answer["running"], True, prog, logparse.meaningful(log)[-8:],
                             ended=logparse.rank_end(log), stopped_by_user=bool(answer.get("stopped_by_user"))))
    return out


def stop(run: Run, hosts: list[Host], wait_s: float = 20) -> dict[str, str]:
    """Stop every rank on every host (train.agent.stop: every process naming the run's save dir);
    confirm none is left. Returns {host: stopped|killed|none}; raises naming the hosts that could
    not be reached or stopped."""
    results = run_all(hosts, agent_command(hosts[0], "stop", "--run", run.remote_dir, "--wait", f"{wait_s:g}"),
                      timeout=wait_s + 15)
    outcome, problems = {}, []
    for host in hosts:
        result = results[host.name]
        if isinstance(result, Exception):
            problems.append(f"{host.name}: unreachable ({result}); its rank may still run")
        elif not result.ok:
            said = result.stdout.strip() or result.stderr.strip()[-300:]
            problems.append(f"{host.name}: training processes still alive after SIGKILL ({said})" if said == "alive"
                            else f"{host.name}: could not stop its rank: {said}")
        else:
            outcome[host.name] = result.stdout.strip()
    if problems:
        raise ClusterError("stop incomplete:\n  " + "\n  ".join(problems))
    return outcome
