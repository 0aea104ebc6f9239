"""--comm powersgd:R on the host: torch's PowerSGD hook on DDP, two real ranks over gloo on loopback.
Each rank runs in its own interpreter (torch's dynamo refuses to import after Ansible's patches)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

TWO_RANKS = """
import sys

import torch
import torch.distributed as dist

from train.agent.trainer import comm_powersgd

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
torch.manual_seed(0)
"""


def run_two(body: str, env: dict | None = None) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = TWO_RANKS + textwrap.dedent(body) + "\ndist.destroy_process_group()\n"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, **(env or {})})
             for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, out + err[-3000:]
            outs.append(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def test_two_ranks_train_with_the_hook_and_hold_the_same_weights():
    """A 64x32 Linear, rank 2, compression from update 2 on: each rank's own data, ten steps; the
    hook compressed (fewer elements after than before) and both ranks hold one model."""
    a, b = run_two("""
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = comm_powersgd.register(ddp, rank=2, start=2)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank + 1)  # each rank's own batches
        for _ in range(10):
            opt.zero_grad()
            ddp(torch.randn(16, 32, generator=gen)).pow(2).mean().backward()
            opt.step()
        digest = [round(float(p.double().sum()), 6) for p in model.parameters()]
        before, after = state.total_numel_before_compression, state.total_numel_after_compression
        print(state.iter, after < before, digest)
    """)
    assert a == b, (a, b)
    assert a.startswith("10 True"), a


def test_fairseqs_ddp_registers_it_when_the_command_asks():
    pytest.importorskip("fairseq")
    a, b = run_two("""
        from fairseq.models import distributed_fairseq_model as dfm

        from train.agent.trainer import fairseq_train

        fairseq_train.ddp_on_cpu()
        fairseq_train.install_comm_hooks()
        ddp = dfm.DistributedDataParallel(torch.nn.Linear(32, 64))
        print(type(ddp.powersgd_state).__name__, ddp.powersgd_state.matrix_approximation_rank,
              ddp.powersgd_state.start_powerSGD_iter, ddp.powersgd_state.use_error_feedback)
    """, env={"TANDEM_POWERSGD": "4:100"})
    assert a == b == "PowerSGDState 4 100 True", (a, b)


def test_without_the_variable_nothing_is_patched():
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from fairseq.models import distributed_fairseq_model as dfm
        from train.agent.trainer import comm_powersgd
        before = dfm.DistributedDataParallel
        comm_powersgd.install()
        assert dfm.DistributedDataParallel is before
    """)], capture_output=True, text=True, timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                                             if k != "TANDEM_POWERSGD"})
    assert done.returncode == 0, done.stderr[-3000:]
