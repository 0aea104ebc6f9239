"""Where a run's checkpoints live besides the hosts' keepers' copies (train.agent.keeper.replica): the
controller's bounded backup of rank 0's newest (`--backup`), read back onto a host where a resume
finds no host holding one; what each host holds (`held`); the push host to host (train.hosts.peercopy's
rsync line, the one prepare-data spreads datasets with) that benchmarks/push_lab.py measures.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..agent.trainer import checkpoint_info
from ..cluster import ClusterError, Host, connect, get_whole, on_each, run_all
from ..hosts.peercopy import copy_to_peers, to_peers_command
from ..hosts.remote import agent_command
from ..recipe.record import Run

CHECKPOINTS = ["checkpoint_last.pt", "checkpoint_best.pt"]
# One copy to or from the controller at a time, whoever asks (the backup, a restart that needs the
# controller's copy): both use the same files, and a restart must read a whole one.
CONTROLLER_COPY = threading.Lock()
# Bytes of checkpoints this process moved through the controller (fetched + uploaded): said at the end.
through_controller = {"bytes": 0}


def fetch_checkpoints(source: Host, save_dir: str, local: Path, tries: int = 3,
                      names: list[str] = CHECKPOINTS) -> list[str]:
    """Copy rank 0's checkpoints to the controller, each only when it changed there (size, mtime):
    following a run backs up every 30 s, and a big preset's checkpoint is GBs on the link being
    trained over. fairseq rewrites checkpoint_last.pt in place at every save, so a copy is kept
    only if the file did not change while it was read (else it is read again). Returns the names
    copied."""
    fetched = []
    with connect(source) as conn:

        def stat(name: str):
            result = conn.run(f"stat -c '%s %y' {shlex.quote(f'{save_dir}/{name}')}", warn=True, hide=True,
                              in_stream=False, timeout=30)
            return result.stdout.strip() if result.ok else None

        for name in names:
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
                through_controller["bytes"] += candidate.stat().st_size
                os.replace(candidate, local / name)
            finally:
                candidate.unlink(missing_ok=True)
            stamp.write_text(before)
            fetched.append(name)
    return fetched


def upload_checkpoints(hosts: list[Host], save_dir: str, local: Path, names: list[str], fresh: list[str]) -> None:
    """The controller's copies onto every host given, where missing, different in size, or `fresh`."""

    def upload(host: Host, conn) -> None:
        conn.run(f"mkdir -p {shlex.quote(save_dir)}", hide=True, in_stream=False)
        for name in names:
            there = conn.run(f"stat -c %s {shlex.quote(f'{save_dir}/{name}')}", warn=True, hide=True, in_stream=False)
            if name in fresh or not there.ok or int(there.stdout) != (local / name).stat().st_size:
                conn.put(str(local / name), f"{save_dir}/{name}")
                through_controller["bytes"] += (local / name).stat().st_size

    failed = on_each(hosts, upload).failed
    if failed:
        raise ClusterError("could not share the checkpoint: " + "; ".join(f"{n}: {r.error}" for n, r in failed.items()))


def push_command(save_dir: str, peers: list[Host]) -> str:
    """The checkpoints (last, best) from the host that has them to every peer (rsync: only what
    changed, into a temporary name, then renamed, so a peer never holds half a checkpoint);
    fairseq may rewrite one while it is read: three tries.

    At a save that improved the validation loss, best is a byte-for-byte copy of last (fairseq
    writes one file and copies it to the others): then last alone crosses the network and each
    peer copies it to best on its own disk, with best's time (so rsync's next quick check passes).
    That halves such a save's bytes off the sending host's NIC (big: 2.5 GB less, beside the
    all-reduce).

    fairseq copies onto last in place (shutil.copyfile) at the next save: where last's time changed
    while it was sent, what reached the peer may be half of each, so both files go again as
    themselves (rsync sends what differs; the peer's torn last carries the old time)."""
    last, best = (shlex.quote(f"{save_dir}/{name}") for name in CHECKPOINTS)
    prelude = (f"files=$(ls {last} {best} 2>/dev/null); same=; seen=$(stat -c %y {last} 2>/dev/null); "
               f"if [ -f {best} ] && cmp -s {last} {best}; then same=1; files={last}; "
               f"stamp=$(stat -c %y {best}); fi; ")
    # run by the peer's shell; double quotes here so that the sender's $stamp goes in
    last_name, best_name = CHECKPOINTS
    local_copy = (f'"cd {shlex.quote(save_dir)} && cp --reflink=auto {last_name} .{best_name}.tmp'
                  f" && touch -d '$stamp' .{best_name}.tmp && mv -f .{best_name}.tmp {best_name}\"")

    def best_from_last(copy: Callable[[str], str], on_peer: Callable[[str], str]) -> str:
        both = f"$(ls {last} {best} 2>/dev/null)"
        return (f'if [ "$(stat -c %y {last} 2>/dev/null)" != "$seen" ]; then {copy(both)}; '
                f'elif [ -n "$same" ]; then {on_peer(local_copy)}; fi')

    return to_peers_command("$files", save_dir, peers, tries=3, prelude=prelude, then=best_from_last)


def push_between_hosts(source: Host, peers: list[Host], save_dir: str) -> None:
    """Copy `source`'s checkpoints to `peers` host to host (the cluster network, not through the
    controller). ClusterError naming each peer that failed; LookupError where `source` has no
    cluster key (provisioned before tandem made one)."""
    failed = copy_to_peers(source, peers, push_command(save_dir, peers))
    if failed:
        raise ClusterError(f"copying checkpoints from {source.name} failed for: " + "; ".join(failed))


def held(run: Run, hosts: list[Host]) -> dict[str, int]:
    """{host: the update of the checkpoint_last.pt it holds}, read on each host from the file's
    small pickle (train.agent.trainer.checkpoint_info: no tensor crosses the link, none is loaded); a host
    that holds none, or none whole, or does not answer, is left out."""
    path = f"{run.remote_dir}/checkpoints/checkpoint_last.pt"
    results = run_all(hosts, agent_command(hosts[0], "trainer.checkpoint_info", path), timeout=60)
    found = {}
    for host in hosts:
        result = results[host.name]
        lines = result.stdout.strip().splitlines() if result.ok else []
        try:
            said = json.loads(lines[-1]) if lines else {}
        except ValueError:
            said = {}
        if isinstance(said, dict) and isinstance(said.get("update"), int):
            found[host.name] = said["update"]
    return found


def newest_holder(hosts: list[Host], updates: dict[str, int]) -> Host | None:
    """The host whose checkpoint is the newest; among equals the first (rank 0 where it holds one)."""
    holders = [h for h in hosts if h.name in updates]
    return max(holders, key=lambda h: (updates[h.name], -hosts.index(h))) if holders else None


def controller_update(local: Path) -> int | None:
    """The update of the controller's copy, from its small pickle (no torch.load of the file)."""
    said = checkpoint_info.read(local / "checkpoint_last.pt", tries=1)
    return said["update"]


@dataclass(frozen=True)
class BackupPolicy:
    """`--backup`: when the controller copies rank 0's newest checkpoint_last.pt off its host.
    `off`: never (the hosts hold each other's copies; losing every host that holds one loses the
    run); `last`: once, when the run ends; `every:MIN`: the newest at most every MIN minutes while
    following (the first at once), and at the end."""

    every_s: float | None
    at_end: bool

    @classmethod
    def parse(cls, text: str) -> BackupPolicy:
        text = (text or "").strip().lower()
        if text == "off":
            return cls(None, False)
        if text == "last":
            return cls(None, True)
        if text.startswith("every:"):
            try:
                minutes = float(text.split(":", 1)[1])
            except ValueError:
                minutes = -1
            if minutes > 0:
                return cls(minutes * 60, True)
        raise ValueError(f"--backup must be off, last or every:MIN (minutes, > 0), not {text!r}")

    def __str__(self) -> str:
        if self.every_s is not None:
            return f"every:{self.every_s / 60:g}"
        return "last" if self.at_end else "off"


DEFAULT_BACKUP = "every:60"  # docs/training.md, "Checkpoints and the controller": why an hour


class Backup:
    """While a run is followed, in the background: per `policy`, rank 0's newest checkpoint_last.pt
    copied to the controller (the last resort, for a resume where no host holds one), one at a time
    under CONTROLLER_COPY; `wait` only at the end. The hosts' keepers copy each save host to host
    themselves (train.agent.keeper.replica)."""

    def __init__(self, run: Run, policy: BackupPolicy | None = None, say=print):
        self.run, self.policy, self.say = run, policy or BackupPolicy.parse(DEFAULT_BACKUP), say
        self._fetch: threading.Thread | None = None
        self._copying: dict[str, str] = {}  # what each copy under way moves, in words
        self._fetched: int | None = None
        self._fetched_at: float | None = None

    @property
    def save_dir(self) -> str:
        return f"{self.run.remote_dir}/checkpoints"

    def maybe_start(self, hosts: list[Host], saved: int | None) -> None:
        """Start what is due and not under way; `saved`: rank 0's last saved update."""
        if saved is None:
            return
        every = self.policy.every_s
        due = every is not None and saved != self._fetched and (
            self._fetched_at is None or time.monotonic() - self._fetched_at >= every)
        if due and not (self._fetch and self._fetch.is_alive()):
            self._fetched_at = time.monotonic()
            self._copying["backup"] = f"update {saved} from {hosts[0].name} to the controller"
            self._fetch = threading.Thread(target=self._to_controller, args=(hosts[0], saved), daemon=True,
                                           name="backup")
            self._fetch.start()

    def _to_controller(self, source: Host, saved: int | None) -> None:
        try:
            with CONTROLLER_COPY:
                local = self.run.local_dir / "checkpoints"
                local.mkdir(parents=True, exist_ok=True)
                fetch_checkpoints(source, self.save_dir, local, names=["checkpoint_last.pt"])
            self._fetched = saved
        except Exception as err:  # a host gone mid-copy (timeout, closed socket): the run goes on, and says so
            self.say(f"checkpoint backup to the controller failed (training goes on): {type(err).__name__}: {err}")

    def under_way(self) -> list[str]:
        """The copies under way, in words (`update 40 from v100a to v100b`)."""
        return [self._copying["backup"]] if self._fetch is not None and self._fetch.is_alive() else []

    def wait(self, say=None) -> None:
        """Until the copies under way (if any) are whole or have failed; `say`, where given, is told
        what is waited for (a GB copy to a laptop takes minutes: a silent wait looks like a hang)."""
        if say is not None and (busy := self.under_way()):
            say(f"waiting for the checkpoint copy under way ({'; '.join(busy)}); Ctrl-C leaves it unfinished "
                "(a partial copy is never used)")
        if self._fetch is not None:
            self._fetch.join()

    def leave(self) -> None:
        """A copy to the controller left unfinished (Ctrl-C twice): its partial file goes now, not
        a GB of it kept on a laptop (unlinked, it is freed once the interpreter exits)."""
        for partial in (self.run.local_dir / "checkpoints").glob("*.partial"):
            partial.unlink(missing_ok=True)

    def final(self, hosts: list[Host]) -> None:
        """The run ended: the newest to the controller, where the policy keeps one."""
        self.wait(say=self.say)
        if self.policy.at_end and hosts:
            self.say(f"copying {hosts[0].name}'s checkpoint_last.pt to the controller (--backup {self.policy}); "
                     "Ctrl-C leaves it unfinished")
            self._to_controller(hosts[0], None)
