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

from train.agent.trainer.fairseq_train import shard_position

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
    from train.agent.trainer import fairseq_train

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


SENTENCES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from fairseq.data import iterators
    from train.agent.trainer import fairseq_train

    fairseq_train.iterator_position_across_world_sizes()
    fairseq_train.epoch_resumes_with_the_sentences_left()

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 600

        def __getitem__(self, i):
            return i

    data = Data()

    def iterator(shards, shard_id, per_batch):
        '''fairseq's iterator as the trainer makes it: batches of `per_batch` sentences (a max_tokens),
        shuffled by epoch, one shard a rank.'''
        batches = [np.arange(i, min(i + per_batch, 600)) for i in range(0, 600, per_batch)]
        return iterators.EpochBatchIterator(dataset=data, collate_fn=lambda s: s, batch_sampler=batches, seed=1,
                                            num_shards=shards, shard_id=shard_id)

    # 3 ranks at 8 sentences a batch take 10 batches each: 240 sentences; the checkpoint is rank 0's state
    seen = []
    for rank in range(3):
        itr = iterator(3, rank, 8).next_epoch_itr(shuffle=True)
        for _ in range(10):
            seen += [int(i) for i in next(itr)]
    three = iterator(3, 0, 8)
    itr = three.next_epoch_itr(shuffle=True)
    for _ in range(10):
        next(itr)
    state = three.state_dict()
    # resumed on 2 ranks, whose derived max_tokens holds 12 sentences a batch, to the epoch's end
    for rank in range(2):
        two = iterator(2, rank, 12)
        two.load_state_dict(state)
        seen += [int(i) for batch in two.next_epoch_itr(shuffle=True) for i in batch]
    print(json.dumps({"seen": len(seen), "distinct": len(set(seen)), "epoch": two.epoch}))
""")


def test_a_resume_on_another_world_and_batch_size_sees_every_sentence_once():
    """The epoch saved at 240 of 600 sentences on 3 ranks of 8-sentence batches goes on on 2 ranks of
    12-sentence batches (another max_tokens, derived for the new world): fairseq's scaled position
    skipped or repeated sentences; now every sentence is seen once in the epoch."""
    done = subprocess.run([sys.executable, "-c", SENTENCES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"seen": 600, "distinct": 600, "epoch": 1}, said


ACROSS_EPOCHS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from fairseq.data import Dictionary, LanguagePairDataset, iterators
    from fairseq.tasks.fairseq_task import FairseqTask
    from train.agent.trainer import fairseq_train

    if sys.argv[1] == "patched":
        fairseq_train.iterator_position_across_world_sizes()
        fairseq_train.epoch_resumes_with_the_sentences_left()

    gen = np.random.default_rng(0)
    lengths = gen.integers(3, 40, size=4000)
    src = [torch.full((int(n),), 5, dtype=torch.long) for n in lengths]
    tgt = [torch.full((int(n),), 6, dtype=torch.long) for n in lengths]
    data = LanguagePairDataset(src, lengths, Dictionary(), tgt, lengths, Dictionary())

    def iterator(shards, rank, epoch):
        '''As the trainer makes it: fairseq's batches (seeded with seed + the epoch it is made in).'''
        return FairseqTask(None).get_batch_iterator(dataset=data, max_tokens=1024, required_batch_size_multiple=8,
                                                    seed=1, num_shards=shards, shard_id=rank, epoch=epoch)

    def sentences(batch):
        return [int(i) for i in batch["id"]] if batch else []

    # 4 ranks, started in epoch 1 (their batches made then), train through epoch 1 and 8 updates of epoch 2
    four = [iterator(4, rank, 1) for rank in range(4)]
    for itr in four:
        list(itr.next_epoch_itr(shuffle=True))
    seen, per_update_four = [], []
    epochs = [itr.next_epoch_itr(shuffle=True) for itr in four]
    for _ in range(8):
        batches = [next(e) for e in epochs]
        per_update_four.append(sum(len(sentences(b)) for b in batches))
        seen += [i for b in batches for i in sentences(b)]
    state = four[0].state_dict()
    # v100b lost: 2 ranks at update-freq 2, made in the checkpoint's epoch (2), as fairseq makes them on a resume
    two = [iterator(2, rank, state["epoch"]) for rank in range(2)]
    for itr in two:
        itr.load_state_dict(state)
    grouped = [iterators.GroupedIterator(itr.next_epoch_itr(shuffle=True), 2) for itr in two]
    per_update_two = []
    for groups in zip(*grouped):
        got = [i for group in groups for b in group for i in sentences(b)]
        per_update_two.append(len(got))
        seen += got
    assert state["epoch"] == 2 and state["iterations_in_epoch"] == 8, state
    print(json.dumps({"seen": len(seen), "distinct": len(set(seen)), "four": float(np.median(per_update_four)),
                      "two": float(np.median(per_update_two[:-1]))}))
""")


def test_a_resume_in_a_later_epoch_goes_on_with_batches_as_full_as_before():
    """fairseq makes an iterator's batches once, seeded with the epoch it is made in: the 4 ranks that
    started in epoch 1 and the 2 that resume in epoch 2 hold other batches. The consumed sentences of
    the first cut across the batches of the second; left as they fell, the resumed ranks trained on
    fragments (the lab's 2 x 2 run: 0.65x the sentences an update on v100a's 2 ranks at update-freq
    2). What is left is batched again, as full as fairseq batches it."""
    done = subprocess.run([sys.executable, "-c", ACROSS_EPOCHS, "patched"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["seen"] == said["distinct"] == 4000, said
    assert said["two"] >= 0.9 * said["four"], said
