"""Which host a run goes on without, and the update frequency that keeps its effective batch."""


from train.run.elastic import scaled_update_freq


def test_the_effective_batch_stays_the_same_or_grows_a_little():
    assert scaled_update_freq(1, 2, 1) == 2
    assert scaled_update_freq(2, 4, 2) == 4
    assert scaled_update_freq(1, 3, 2) == 2  # 1.5 rounded up: never a smaller batch
    assert scaled_update_freq(4, 2, 2) == 4
