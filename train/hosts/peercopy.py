"""Copying host to host over the cluster network: the shell line, run on the host that holds the
files, that rsyncs them to every peer at once with the cluster key, and the call that runs it.
A run's checkpoints (train.run.checkpoints) and a prepared dataset (train.data.distribute) cross
the cluster this way, never through the controller.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from ..cluster import TRANSFER_STALL_S, Host, connect

CLUSTER_KEY = "$HOME/.ssh/tandem_cluster"  # roles/common/tasks/cluster_key.yml


def cluster_address(host: Host) -> str:
    """Where the other hosts reach this one (Host.cluster_address: the inventory's
    `cluster_address`, else the address tandem connects to)."""
    return host.cluster_address


# the cluster key's ssh on the host that copies (the shell expands $HOME there): rsync's -e, and
# the few commands a push runs on a peer
CLUSTER_SSH_OPTIONS = (f"-i {CLUSTER_KEY} -o BatchMode=yes -o ConnectTimeout=10"
                       " -o ServerAliveInterval=10 -o ServerAliveCountMax=3")
CLUSTER_SSH = f'"ssh {CLUSTER_SSH_OPTIONS}"'


def to_peers_command(sources: str, dest_dir: str, peers: list[Host], rsync_options: str = "-a", tries: int = 1,
                     prelude: str = "", then: Callable[[Callable[[str], str], Callable[[str], str]], str] | None = None
                     ) -> str:
    """The shell line, run on the host that holds `sources` (words the shell there expands), that
    rsyncs them into `dest_dir` on every peer at once, over the cluster network with the cluster
    key; rsync's exits 23/24 (a file rewritten while read) are tried again up to `tries` times. It
    prints `PEER rc [rsync's last words]` per peer; rsync's errors go to a directory of this call's
    own (a fixed name in /tmp may be another user's file). `then(copy, on_peer)`, where given, is a
    shell step run per peer after its copy succeeded (copy(words): rsync those to it; on_peer(cmd):
    run cmd there); it sets $rc."""
    rsync = (f"rsync {rsync_options} --timeout={TRANSFER_STALL_S} "
             f"--rsync-path={shlex.quote(f'mkdir -p {dest_dir} && rsync')}")
    pushes = []
    for peer in peers:
        login = f"{peer.user}@{cluster_address(peer)}"
        target = shlex.quote(f"{login}:{dest_dir.rstrip('/')}/")
        err = f'"$errs/{peer.name}"'

        def copy(words: str, target=target, err=err) -> str:
            return (f"for try in {' '.join(str(i) for i in range(1, tries + 1))}; do {rsync} -e {CLUSTER_SSH} "
                    f"{words} {target} >/dev/null 2>{err}; rc=$?; "
                    f"[ $rc = 23 ] || [ $rc = 24 ] || break; sleep 2; done")

        def on_peer(command: str, login=login, err=err) -> str:
            return f"ssh {CLUSTER_SSH_OPTIONS} {login} {command} </dev/null >/dev/null 2>{err}; rc=$?"

        step = f" if [ $rc = 0 ]; then {then(copy, on_peer)}; fi;" if then else ""
        pushes.append(f"{{ {copy(sources)};{step} "
                      f"echo {peer.name} $rc $(tail -c 300 {err} | tr '\\n' ' '); }} &")
    return (f'test -f "{CLUSTER_KEY}" || {{ echo no-cluster-key; exit 3; }}; errs=$(mktemp -d) || exit 4; '
            + prelude + " ".join(pushes) + ' wait; rm -rf "$errs"')


def copy_to_peers(source: Host, peers: list[Host], command: str) -> list[str]:
    """Run a to_peers_command on `source`; the lines of the peers whose copy failed. LookupError
    where `source` has no cluster key (provisioned before tandem made one)."""
    with connect(source) as conn:
        result = conn.run(command, warn=True, hide=True, in_stream=False)
    if "no-cluster-key" in result.stdout:
        raise LookupError(f"{source.name} has no cluster key ({CLUSTER_KEY}): re-run provisioning")
    answers = {line.split(" ", 1)[0]: line for line in result.stdout.splitlines() if line.strip()}
    return [answers.get(p.name, f"{p.name} (no answer)") for p in peers
            if answers.get(p.name, "").split(" ")[1:2] != ["0"]]
