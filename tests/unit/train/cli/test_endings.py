"""How fab ends when the user ends it (train.cli.executor.ends_as_documented, docs/cli.md): Ctrl-C says
`interrupted` and exits 130; a reader that closes the pipe (`fab -l | head -1`) ends it quietly, exit 0;
neither with a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[4]
FAB = str(Path(sys.executable).parent / "fab")


def fab_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """fab with its stdout a pipe whose reader is gone before fab writes: `fab ... | head -1` when head
    has its line before fab's next write, every time."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([FAB, *args], cwd=TOP, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "FABRIC_INVENTORY": "inventory/hosts.yml"})
    finally:
        os.close(write)


def test_a_closed_pipe_ends_the_listing_and_the_help_quietly():
    for args in (["-l"], ["--help", "train"]):
        proc = fab_into_a_closed_pipe(*args)
        assert (proc.returncode, proc.stderr) == (0, ""), (args, proc.stderr[-2000:])


def test_fab_l_piped_to_head_prints_its_first_line_and_no_traceback():
    for args, first in (("-l", "Available tasks:"), ("--help train", "Usage: fab [--core-opts] train [--options]")):
        proc = subprocess.run(f"{FAB} {args} | head -1; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
                              cwd=TOP, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "FABRIC_INVENTORY": "inventory/hosts.yml"})
        assert proc.stdout.startswith(first) and proc.stdout.count("\n") == 1, proc.stdout
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr[-2000:]


def test_ctrl_c_says_interrupted_and_exits_130(tmp_path):
    """Ctrl-C while `fab status` waits for a host's SSH banner (a port that accepts and says nothing)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        inventory = tmp_path / "silent.yml"
        inventory.write_text(f"""all:
  vars: {{ansible_user: nobody}}
  children:
    cluster:
      hosts:
        alpha: {{ansible_host: 127.0.0.1, ansible_port: {silent.getsockname()[1]}, gpus: 0}}
""")
        proc = subprocess.Popen(
            [FAB, "status"], cwd=TOP, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "FABRIC_INVENTORY": str(inventory), "TANDEM_CACHE": str(tmp_path / "cache")},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as at a terminal, even from `cmd &`
        try:
            silent.settimeout(60)
            connection, _ = silent.accept()  # fab is in the task, waiting for alpha
            with connection:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert (proc.returncode, err, out) == (130, "interrupted\n", "")
