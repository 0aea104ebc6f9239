"""Which host a run goes on without, and the update frequency that keeps its effective batch."""

from test_why_stopped import TORCHRUN_EXIT, TORCHRUN_SIGKILL, state

from train.run.elastic import lost_hosts, scaled_update_freq


def test_the_unreachable_host_is_the_lost_one():
    assert lost_hosts([state("v100a", lines=TORCHRUN_EXIT), state("v100b", reachable=False)]) == ["v100b"]


def test_else_the_host_whose_rank_failed_first():
    assert lost_hosts([state("v100a", lines=TORCHRUN_EXIT), state("v100b", lines=TORCHRUN_SIGKILL)]) == ["v100b"]


def test_nothing_is_lost_when_no_rank_failed():
    assert lost_hosts([state("v100a"), state("v100b")]) == []


def test_the_effective_batch_stays_the_same_or_grows_a_little():
    assert scaled_update_freq(1, 2, 1) == 2
    assert scaled_update_freq(2, 4, 2) == 4
    assert scaled_update_freq(1, 3, 2) == 2  # 1.5 rounded up: never a smaller batch
    assert scaled_update_freq(4, 2, 2) == 4
