"""`fab tensorboard`: TensorBoard on rank 0's host, reachable from the controller only.

TensorBoard reads the run's `--tensorboard-logdir` (RUN/tensorboard: fairseq writes train_inner,
train and valid there) and listens on 127.0.0.1 of rank 0's host, a port no other machine can
reach: the hosts' firewall stays as provisioning left it. Fabric forwards a local port on the
controller to it through the SSH connection (Connection.forward_local). Ctrl-C stops both.
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager

from ..cluster import ClusterError, Host, connect

PID_FILE = "tensorboard.pid"


def free_port_command(python: str) -> str:
    """Asks the host for a free port on its loopback (another user's TensorBoard may hold 6006)."""
    code = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    return f"{shlex.quote(python)} -c {shlex.quote(code)}"


def start_command(venv: str, run_dir: str, port: int) -> str:
    """Stop this run's earlier TensorBoard (a second `fab tensorboard` replaces it), then start one
    detached, bound to 127.0.0.1; its pid (a session leader: setsid) in RUN/tensorboard.pid."""
    q = shlex.quote
    pid, out = q(f"{run_dir}/{PID_FILE}"), q(f"{run_dir}/tensorboard.out")
    argv = [f"{venv.rstrip('/')}/bin/tensorboard", "--logdir", f"{run_dir}/tensorboard", "--host", "127.0.0.1",
            "--port", str(port), "--reload_interval", "2", "--load_fast", "false"]
    return (f"{stop_command(run_dir)}; mkdir -p {q(run_dir + '/tensorboard')} && "
            f"{{ setsid nohup {shlex.join(argv)} > {out} 2>&1 < /dev/null & echo $! > {pid}; }}")


def stop_command(run_dir: str) -> str:
    pid = shlex.quote(f"{run_dir}/{PID_FILE}")
    return f"if [ -s {pid} ]; then kill -- -$(cat {pid}) 2>/dev/null; rm -f {pid}; fi"


def ready_command(python: str, run_dir: str, port: int, wait_s: float) -> str:
    """Exits 0 once TensorBoard answers on the host's loopback; 1 as soon as its process is gone
    (not installed, a bad log dir), or after `wait_s` seconds."""
    code = (f"import os, time, urllib.error, urllib.request\n"
            f"pid = int(open({run_dir + '/' + PID_FILE!r}).read())\n"
            f"end = time.time() + {wait_s}\n"
            f"while True:\n"
            f"    try:\n        urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2); break\n"
            f"    except urllib.error.HTTPError:\n        break  # it answers\n"
            f"    except OSError:\n        pass\n"
            f"    try:\n        os.kill(pid, 0)\n    except OSError:\n        raise SystemExit(1)\n"
            f"    if time.time() > end:\n        raise SystemExit(1)\n"
            f"    time.sleep(0.5)\n")
    return f"{shlex.quote(python)} -c {shlex.quote(code)}"


def local_port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def served(host: Host, venv: str, run_dir: str, local_port: int, wait_s: float = 90):
    """TensorBoard running on `host` and forwarded to 127.0.0.1:local_port while inside."""
    if not local_port_free(local_port):
        raise ClusterError(f"port {local_port} is in use on this machine: pick another with --port")
    python = f"{venv.rstrip('/')}/bin/python"
    with connect(host) as conn:
        def run(cmd: str):
            return conn.run(cmd, hide=True, warn=True, in_stream=False)

        port = run(free_port_command(python))
        if not port.ok:
            raise ClusterError(f"{host.name}: {python} did not answer ({port.stderr.strip()[-200:]}); provision it")
        remote = int(port.stdout.strip())
        started = run(start_command(venv, run_dir, remote))
        try:
            if not started.ok or not run(ready_command(python, run_dir, remote, wait_s)).ok:
                log = run(f"tail -n 5 {shlex.quote(run_dir + '/tensorboard.out')}").stdout.strip()
                raise ClusterError(f"{host.name}: TensorBoard did not start: {log or started.stderr.strip()}\n"
                                   "(provision.yml installs it: tensorboard in requirements-train.txt)")
            with conn.forward_local(local_port, remote_port=remote, remote_host="127.0.0.1", local_host="127.0.0.1"):
                yield f"http://127.0.0.1:{local_port}/", remote
        finally:
            run(stop_command(run_dir))


def serve(host: Host, venv: str, run_dir: str, local_port: int, say: Callable[[str], None]) -> None:
    """Until Ctrl-C."""
    with served(host, venv, run_dir, local_port) as (url, remote):
        say(f"TensorBoard of {run_dir} on {host.name} (127.0.0.1:{remote} there), forwarded over SSH: {url}")
        say("Ctrl-C stops TensorBoard and the tunnel")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            say("stopping TensorBoard and the tunnel")
