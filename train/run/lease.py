"""The controller's side of train.agent.measure.lease: what a benchmark changes on the hosts is undone by the
hosts themselves when the controller stops renewing it (killed, asleep, offline).

    with HostLease(hosts, "bench-RUN", undo={host: "stop the ranks; remove the cap"}):
        ... change things on the hosts ...

On entry every host starts a holder (detached) and the lease file is touched every `renew_s` in a
thread; on exit the files are removed (released: the controller undid everything itself). A
controller that never reaches the exit leaves files that age: after `ttl_s` each host undoes.
"""

from __future__ import annotations

import threading

from ..cluster import ClusterError, Host, run_all, run_each
from ..hosts.remote import agent_command

LEASES = "$HOME/.tandem/leases"  # the login user's own (a fixed name in /tmp may be another user's)
TTL_S = 60.0
RENEW_S = 15.0


class HostLease:
    def __init__(self, hosts: list[Host], name: str, undo: dict[str, str], ttl_s: float = TTL_S,
                 renew_s: float = RENEW_S):
        self.hosts, self.name, self.undo, self.ttl_s, self.renew_s = hosts, name, undo, ttl_s, renew_s
        self.file = f"{LEASES}/{name}"
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def holder_command(self, host: Host) -> str:
        # the file's $HOME expands on the host: outside the quoting agent_command applies to the rest
        hold = agent_command(host, "measure.lease", "hold", "--ttl", f"{self.ttl_s:g}", "--undo", self.undo[host.name])
        hold += f' --file "{self.file}"'
        return (f'mkdir -p {LEASES} && touch "{self.file}" && '
                f'{{ setsid nohup {hold} >> "{self.file}.log" 2>&1 < /dev/null & }}')

    def __enter__(self) -> HostLease:
        problems = run_each(self.hosts, {h.name: self.holder_command(h) for h in self.hosts}, timeout=30).problems()
        if problems:
            self.release()
            raise ClusterError("could not take the hosts' lease (nothing changed yet):\n  " + "\n  ".join(problems))
        self._renewer = threading.Thread(target=self._renew, daemon=True, name=f"lease {self.name}")
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            run_all(self.hosts, f'touch "{self.file}"', timeout=10)  # a missed one is made up by the next

    def release(self) -> None:
        self._stop.set()
        run_all(self.hosts, f'rm -f "{self.file}"', timeout=10)

    def __exit__(self, *exc) -> None:
        self.release()

