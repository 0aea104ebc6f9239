"""`fab logs --follow`: every host's training log as it grows, each line prefixed with its host.

One SSH connection per host runs `tail -n LINES -F RUN_DIR/train.log` in a pty (closing the
connection hangs it up, so no tail is left behind on a host). Ctrl-C ends following; the hosts
train on. A host that cannot be reached, or whose connection drops, is said at once and named at
the end (a non-zero exit: train.run.status.require_reachable).
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Callable

from ..cluster import Host, connect
from ..recipe.record import Run
from ..watch.render import plain
from .status import require_reachable


class HostPrefixed:
    """A Fabric out_stream that says each whole line as `host | line` (a pty ends lines with \\r\\n), its
    terminal escapes taken out (train.watch.render.plain)."""

    def __init__(self, prefix: str, say: Callable[[str], None]):
        self.prefix, self.say, self.pending = prefix, say, ""

    def write(self, text: str) -> None:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.say(self.prefix + plain(line.rstrip("\r")))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.pending.strip():
            self.say(self.prefix + plain(self.pending.rstrip("\r")))
        self.pending = ""


def follow_logs(run: Run, hosts: list[Host], lines: int, say: Callable[[str], None], opener=connect,
                stop: threading.Event | None = None) -> dict[str, str]:
    """Say every host's log lines as they come until Ctrl-C, `stop`, or no host's tail runs any more.
    Returns {host: why} for the hosts that could not be followed to the end."""
    stop = stop or threading.Event()
    width = max(len(h.name) for h in hosts)
    lock = threading.Lock()
    lost: dict[str, str] = {}
    connections = []

    def said(line: str) -> None:
        with lock:  # one whole line at a time, whichever host's thread says it
            say(line)

    def one(host: Host) -> None:
        out = HostPrefixed(f"{host.name:<{width}} | ", said)
        command = f"tail -n {int(lines)} -F {shlex.quote(run.remote_dir + '/train.log')}"
        try:
            with opener(host) as conn:
                connections.append(conn)
                if not stop.is_set():
                    result = conn.run(command, out_stream=out, pty=True, warn=True, in_stream=False)
                    why = f"tail ended (exit {result.exited})"
                    if not stop.is_set():
                        lost[host.name] = why
                        out.say(out.prefix + why)
        except Exception as err:  # any failure is this host's, said and named at the end
            if not stop.is_set():
                lost[host.name] = f"{type(err).__name__}: {err}"
                out.say(f"{out.prefix}unreachable: {lost[host.name]}")
        finally:
            out.close()

    threads = [threading.Thread(target=one, args=(h,), name=f"logs-{h.name}", daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads) and not stop.wait(0.2):
            pass
    except KeyboardInterrupt:
        pass  # Ctrl-C: following ends, cleanly
    stop.set()
    for conn in list(connections):
        with contextlib.suppress(Exception):
            conn.close()  # ends its tail: the pty hangs up
    for thread in threads:
        thread.join(5)
    return lost


def follow(run: Run, hosts: list[Host], lines: int, console, opener=connect) -> None:
    """`fab logs --follow` on the run's hosts; raises naming those that could not be followed."""
    chosen = run.hosts_of(hosts)
    console.print(f"following {run.run_id}'s train.log on {', '.join(h.name for h in chosen)}; Ctrl-C ends it "
                  "(the hosts train on)", markup=False)
    lost = follow_logs(run, chosen, lines, lambda line: console.print(line, markup=False, highlight=False), opener)
    require_reachable(lost)
