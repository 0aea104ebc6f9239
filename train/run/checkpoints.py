"""Where a run's checkpoints live and how they travel: host to host over the cluster network first,
the controller's copy as the backup when rank 0's host is lost.

fairseq saves on rank 0 only; at a resume a rank that finds no checkpoint skips the broadcast and
deadlocks, so every host of a (re)start gets rank 0's checkpoint first (`share_checkpoint`).
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from pathlib import Path

from ..cluster import TRANSFER_STALL_S, ClusterError, Host, connect, get_whole, on_each, run_all
from .record import Run

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

    failed = on_each(hosts, upload).failed
    if failed:
        raise ClusterError("could not share the checkpoint: " + "; ".join(f"{n}: {r.error}" for n, r in failed.items()))


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
        err = f'"$errs/{peer.name}"'
        # rsync exits 23/24 when fairseq rewrites or replaces a checkpoint while it is read: try again
        pushes.append(f"{{ for try in 1 2 3; do {rsync} -e {ssh} "
                      f"$files {shlex.quote(target)} >/dev/null 2>{err}; rc=$?; "
                      f"[ $rc = 23 ] || [ $rc = 24 ] || break; sleep 2; done; "
                      f"echo {peer.name} $rc $(tail -c 300 {err} | tr '\\n' ' '); }} &")
    # rsync's errors in a directory of this call's own (a fixed name in /tmp may be another user's file)
    return (f'test -f "{CLUSTER_KEY}" || {{ echo no-cluster-key; exit 3; }}; errs=$(mktemp -d) || exit 4; '
            f"files=$(ls {names} 2>/dev/null); " + " ".join(pushes) + ' wait; rm -rf "$errs"')


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
    source = next((h for h in hosts if have[h.name].ok and have[h.name].stdout.strip()), None)
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
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    return int(state.get("optimizer_history", [{}])[-1].get("num_updates", 0))




class Backup:
    """Rank 0's checkpoints copied off its host while a run is followed, in the background (a
    multi-GB copy must not hold up noticing a dead rank), one copy at a time whoever asks: the
    first checkpoint at once (a host lost early must not cost the whole run), then every
    `every_s`. `wait` before anything else reads or writes the same copies (a restart)."""

    def __init__(self, run: Run, every_s: float = 30.0, say=print):
        self.run, self.every_s, self.say = run, every_s, say
        self._thread: threading.Thread | None = None
        self._started_at = time.monotonic()
        self._began = False

    def maybe_start(self, hosts: list[Host], saved: int | None) -> None:
        """Start a copy if one is due and none is under way; `saved`: rank 0's last saved update."""
        first = saved is not None and not self._began
        due = first or time.monotonic() - self._started_at > self.every_s
        if not due or (self._thread and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self.now, args=(list(hosts),), daemon=True, name="backup")
        self._thread.start()
        self._started_at, self._began = time.monotonic(), self._began or saved is not None

    def wait(self) -> None:
        """Until the copy under way (if any) is whole or has failed."""
        if self._thread is not None:
            self._thread.join()

    def now(self, hosts: list[Host]) -> None:
        """One copy, here and now; a failure is said, not raised: the run goes on."""
        try:
            share_checkpoint(self.run, hosts)
        except Exception as err:  # a host gone mid-copy (timeout, closed socket): the run goes on, and says so
            self.say(f"checkpoint copy failed (training goes on): {type(err).__name__}: {err}")
