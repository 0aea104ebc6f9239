"""Local SGD (fairseq's BMUF) resumes with its outer state, and syncs in one all-reduce.

Each test runs in its own interpreter, as a rank does: torch's dynamo refuses to import after
Ansible (loaded by other unit tests in this process) has patched sys.intern."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("fairseq")

BMUF_AROUND = """
from types import SimpleNamespace

import torch
import torch.distributed as dist
from fairseq.optim import FairseqOptimizer
from fairseq.optim.bmuf import FairseqBMUF

from train.agent.trainer import comm_local_sgd

comm_local_sgd.local_sgd_state_in_checkpoints()


class Plain(FairseqOptimizer):
    def __init__(self, params):
        super().__init__(SimpleNamespace())
        self._optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)


def bmuf_around(params):
    '''fairseq's BMUF around a plain SGD, as the trainer builds it for --use-bmuf.'''
    outer = SimpleNamespace(global_sync_iter=4, block_momentum=0.5, block_lr=1.0, warmup_iterations=0,
                            use_nbm=True, average_sync=False, distributed_world_size=2)
    return FairseqBMUF(outer, Plain(params))
"""


def run(body: str) -> None:
    done = subprocess.run([sys.executable, "-c", BMUF_AROUND + textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_the_outer_state_survives_a_checkpoint():
    run("""
        bmuf = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        bmuf.smoothed_grads[0].fill_(0.25)  # momentum built up over earlier syncs
        bmuf.global_params[0].fill_(2.0)  # the model as of the last sync
        saved = bmuf.state_dict()
        assert "tandem_bmuf" in saved

        restarted = bmuf_around([torch.nn.Parameter(torch.ones(3))])  # a new process: zero momentum
        restarted.load_state_dict(saved)
        assert restarted.smoothed_grads[0].tolist() == [0.25] * 3
        assert restarted.global_params[0].tolist() == [2.0] * 3
        assert "momentum_buffer" not in str(saved["tandem_bmuf"]), "the inner optimizer's state stays its own"
    """)


def test_a_plain_average_saves_no_outer_state():
    run("""
        bmuf = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        bmuf.block_momentum = 0
        assert "tandem_bmuf" not in bmuf.state_dict()
    """)


def test_a_checkpoint_from_before_loads_as_it_did():
    run("""
        bmuf = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        old = {k: v for k, v in bmuf.state_dict().items() if k != "tandem_bmuf"}
        fresh = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        fresh.load_state_dict(old)
        assert fresh.smoothed_grads[0].tolist() == [0.0] * 3
    """)


def test_a_sync_is_one_all_reduce_of_every_delta():
    """fairseq's BMUF all-reduces tensor by tensor (a Transformer: 100+ round trips per sync);
    tandem's does it once, with the same average."""
    run("""
        bmuf = bmuf_around([torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(4))])
        bmuf.grads = [torch.full((2, 3), 4.0), torch.arange(4.0)]
        calls = []

        def all_reduce(tensor, op=None):  # a second rank whose deltas are all 2.0
            calls.append(tensor.numel())
            tensor.add_(2.0 / 2)

        dist.all_reduce, dist.get_world_size = all_reduce, lambda: 2
        bmuf._avg_grad_from_all_gpus()
        assert calls == [10], calls
        assert bmuf.grads[0].tolist() == [[3.0] * 3] * 2  # (4 + 2) / 2
        assert bmuf.grads[1].tolist() == [1.0, 1.5, 2.0, 2.5]  # (i + 2) / 2
    """)


def test_the_first_updates_average_the_gradients_then_each_rank_steps_alone():
    """TANDEM_LOCAL_SGD_SYNC_UPDATES=2: updates 1 and 2 step on the ranks' mean gradient (as sync),
    update 3 on this rank's own; one all-reduce per synchronous update."""
    run("""
        import os

        os.environ["TANDEM_LOCAL_SGD_SYNC_UPDATES"] = "2"
        comm_local_sgd.local_sgd_synchronous_start()
        param = torch.nn.Parameter(torch.zeros(3))
        bmuf = bmuf_around([param])
        calls = []

        def all_reduce(tensor, op=None):  # the other rank's gradient is 1.0 everywhere
            calls.append(tensor.numel())
            tensor.add_(1.0 / 2)

        dist.all_reduce, dist.get_world_size = all_reduce, lambda: 2
        steps = []
        for _ in range(3):
            param.grad = torch.full((3,), 3.0)  # this rank's
            before = param.detach().clone()
            bmuf.step()
            steps.append(round(float((before - param.detach())[0]), 4))
        assert calls == [3, 3], calls
        # SGD, lr 0.1, momentum 0.9: the mean gradient 2.0 twice, then this rank's 3.0
        assert steps == [0.2, 0.38, 0.642], steps
    """)


def test_bmufs_own_update_count_survives_a_checkpoint():
    """fairseq restores the trainer's update count, never BMUF's: a resume began counting at 0, so the
    synchronous start ran again (hours of all-reduce on a slow link) and the syncs shifted."""
    run("""
        bmuf = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        bmuf.set_num_updates(1234)
        restarted = bmuf_around([torch.nn.Parameter(torch.ones(3))])
        restarted.load_state_dict(bmuf.state_dict())
        assert restarted.get_num_updates() == 1234, restarted.get_num_updates()
    """)
