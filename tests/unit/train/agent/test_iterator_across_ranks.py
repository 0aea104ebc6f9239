"""A checkpoint resumed on another number of ranks keeps the data iterator's share of the epoch.

fairseq's EpochBatchIterator saves its place as batches of one rank's shard. The lab's 2 hosts x 2
ranks run, grown back from v100a's 2 ranks to 4, died on every rank with "Cannot resume training due
to dataloader mismatch": 2 ranks' place was past the end of a 4-rank shard. Real fairseq iterators
here, in an interpreter of their own (as the other agent tests: torch after Ansible's patches)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from train.agent.fairseq_train import shard_position

pytest.importorskip("fairseq")


def test_the_place_is_kept_as_a_share_of_the_epoch():
    assert shard_position(8, 2, 4, 5) == (4, False)  # 2 ranks at 8 of 10 -> 4 ranks at 4 of 5: 16 of 20 batches
    assert shard_position(4, 4, 2, 10) == (8, False)  # 4 -> 2 (an elastic restart): not 4 of 10, which repeats data
    assert shard_position(9, 2, 4, 5) == (4, False)  # rounded down: a batch again rather than one skipped
    assert shard_position(7, 4, 4, 5) == (0, True)  # the same shards, past the end: the next epoch
    assert shard_position(6, None, 4, 5) == (0, True)  # an older checkpoint: no shard count, the next epoch
    assert shard_position(3, None, 4, 5) == (3, False)


RESUME = textwrap.dedent("""
    import json, sys
    import torch
    from fairseq.data import iterators
    from train.agent import fairseq_train

    if sys.argv[1] == "patched":
        fairseq_train.iterator_position_across_world_sizes()
    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return i

    data = Data()
    batches = [[i, i + 1] for i in range(0, 40, 2)]  # 20 batches of 2

    def iterator(shards, shard_id=0):
        return iterators.EpochBatchIterator(dataset=data, collate_fn=lambda s: s, batch_sampler=batches,
                                            num_shards=shards, shard_id=shard_id)

    two = iterator(2)  # 10 batches a rank
    itr = two.next_epoch_itr(shuffle=False)
    for _ in range(8):
        next(itr)
    state = two.state_dict()
    four = iterator(4, shard_id=3)  # 5 batches a rank
    try:
        four.load_state_dict(state)
        left = list(four.next_epoch_itr(shuffle=False))
        print(json.dumps({"epoch": four.epoch, "left": len(left), "state": state}))
    except RuntimeError as err:
        print(json.dumps({"error": str(err)}))
""")


def resume(mode: str) -> dict:
    import json

    done = subprocess.run([sys.executable, "-c", RESUME, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fairseq_alone_dies_growing_from_two_ranks_to_four_mid_epoch():
    assert "dataloader mismatch" in resume("fairseq")["error"]


def test_tandem_goes_on_at_the_same_share_of_the_epoch():
    said = resume("patched")
    assert said["state"]["tandem_num_shards"] == 2 and said["state"]["iterations_in_epoch"] == 8
    assert said["epoch"] == 1 and said["left"] == 1  # 4 of 5 done: 16 of the epoch's 20 batches, as before
