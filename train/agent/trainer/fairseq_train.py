"""fairseq-train with fairseq 0.12's device and failure assumptions fixed: tandem starts every run with it.

    python -m train.agent.trainer.fairseq_train DATA ...      (the same arguments as fairseq-train)

- `--bf16` means bfloat16 on the GPU, not on a TPU (below);
- attention on a GPU does not use cuDNN's kernels (below);
- the process group times out with the run's heartbeat, not NCCL's 10 minutes, and the heartbeat
  kills a rank stuck in a collective instead of interrupting it (below);
- `--ddp-backend pytorch_ddp` works on CPU hosts: fairseq hands DistributedDataParallel
  `device_ids=[device_id]`, which torch refuses for a CPU module, so CPU runs could only use
  legacy_ddp, whose all-reduce never overlaps the backward pass. The lab measures that overlap
  (benchmarks.step) with this.

- each communication strategy's host-side hook is installed from its own module,
  train/agent/comm_*.py (local SGD's BMUF fixes: train.agent.trainer.comm_local_sgd); each acts only
  when the run's command asks for its strategy (install_comm_hooks, below).
- a checkpoint resumes on another number of ranks (an elastic restart, a host grown back): the
  data iterator's place in the epoch is kept as a share of the epoch, not as a count of one
  rank's batches (below).

On GPUs Adam's step and fp16's master copy take a few kernels instead of a few per tensor
(train/agent/trainer/fast_steps.py).

With TANDEM_PROFILE=FIRST:COUNT:DIR it also profiles a window of updates (train/agent/trainer/profile.py).

Checkpoints (a peer's, a bucket's) load as data only: a pickle that would run code is refused
by name (train/agent/trainer/checkpoints_as_data.py).

SIGUSR2 to rank 0's process saves checkpoint_last at the end of its update and trains on: a spot
VM's notice (train.agent.keeper.preemption) ends a host's part in the run from a fresh save (below).

fairseq 0.12 ties `--bf16` to TPUs: `options.add_defaults` sets `tpu=True`, and
`distributed_init` then imports torch_xla, which a GPU host lacks, so every rank dies at start.
The rest of fairseq already does bf16 on a GPU: the trainer casts the model to bfloat16 and
FP16Optimizer keeps fp32 master weights, with no loss scaling for bf16. This entry point parses
the arguments as fairseq-train does and clears `tpu` again when CUDA is the device; everything
else is fairseq-train itself.
"""

from __future__ import annotations

import os

from train.agent.trainer import checkpoints_as_data, compiled_layers, fast_steps, fused_loss


def bf16_on_gpu(args):
    """`args` (fairseq's parsed namespace) with bf16 kept on the GPU instead of a TPU."""
    if getattr(args, "bf16", False) and not getattr(args, "cpu", False):
        args.tpu = False
    return args


def patch_parser() -> None:
    """Make fairseq's own `parse_args_and_arch` return bf16-on-GPU arguments."""
    from fairseq import options

    parse = options.parse_args_and_arch
    if getattr(parse, "_tandem_bf16", False):
        return

    def parse_args_and_arch(*args, **kwargs):
        return bf16_on_gpu(parse(*args, **kwargs))

    parse_args_and_arch._tandem_bf16 = True  # type: ignore[attr-defined]
    options.parse_args_and_arch = parse_args_and_arch


def attention_without_cudnn() -> None:
    """Keep torch's scaled_dot_product_attention (fairseq's attention calls it) off the cuDNN
    backend, which torch prefers on Hopper GPUs. cuDNN builds an execution plan per input shape,
    and fairseq's batches change shape every update (sentences bucketed by length): on an H100
    the plan building took 110–125 ms of host time per Transformer update, the GPU idle 90% of
    the time (benchmarks/README.md, "On a GPU machine"). Flash and memory-efficient attention
    have no per-shape plans. TANDEM_CUDNN_ATTENTION=1 keeps cuDNN."""
    import torch

    if os.environ.get("TANDEM_CUDNN_ATTENTION") != "1" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def process_group_timeout() -> None:
    """fairseq calls init_process_group without a timeout: NCCL's default is 10 minutes, so the
    ranks of a host that vanished mid-all-reduce stay blocked that long. TANDEM_PG_TIMEOUT_S
    (tandem sets it to the run's heartbeat) becomes the default timeout instead; where the layers
    compile in training, at least the compile allowance (compiled_layers.process_group_timeout_s: the
    first all-reduce waits for the slowest rank's compile)."""
    seconds = os.environ.get("TANDEM_PG_TIMEOUT_S")
    if not seconds:
        return
    import datetime

    import torch.distributed as dist

    init = dist.init_process_group
    if getattr(init, "_tandem_timeout", False):
        return

    def init_process_group(*args, **kwargs):
        timeout = compiled_layers.process_group_timeout_s(float(seconds))
        kwargs.setdefault("timeout", datetime.timedelta(seconds=timeout))
        return init(*args, **kwargs)

    init_process_group._tandem_timeout = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def heartbeat_kills() -> None:
    """fairseq's heartbeat (--heartbeat-timeout) sends its own process SIGINT. A rank whose peer
    vanished is blocked inside a collective, in C++, and never runs Python's handler: it logs
    "Killing job for not making progress" and stays (seen for > 240 s on the lab, torchrun and
    all). SIGKILL ends it wherever it is; torchrun then ends the host's part of the run.
    A rank that compiles (compile_layers) is not making progress either, for a minute or two, nor is
    one waiting for it in an all-reduce: the watcher lets the compile allowance pass after each compile
    starts or ends (compiled_layers.heartbeat_deadline) before it kills."""
    import signal
    import time

    from fairseq.distributed import distributed_timeout_wrapper as wrapper

    cls = wrapper.DistributedTimeoutWrapper
    if getattr(cls, "_tandem_kill", False):
        return
    init = cls.__init__

    def __init__(self, module, timeout, signal=signal.SIGKILL):
        init(self, module, timeout, signal)

    def _check_heartbeat(self, parent_pid):
        self._heartbeat.wait()  # the first forward
        while True:
            self._heartbeat.clear()
            started = time.monotonic()
            beat = self._heartbeat.wait(timeout=self.timeout)
            while not beat and not self._terminated:
                left = compiled_layers.heartbeat_deadline(started, self.timeout) - time.monotonic()
                if left <= 0:
                    break
                beat = self._heartbeat.wait(timeout=left)
            if self._terminated:
                break
            if not beat:
                wrapper.logger.error(f"Killing job for not making progress in {int(time.monotonic() - started)} "
                                     "seconds. Set --heartbeat-timeout=-1 to disable this timeout.")
                os.kill(parent_pid, self.signal)
                return

    cls.__init__ = __init__
    cls._check_heartbeat = _check_heartbeat
    cls._tandem_kill = True


def ddp_on_cpu() -> None:
    """Give fairseq a DistributedDataParallel that leaves device_ids unset for a CPU module."""
    import torch
    from fairseq.models import distributed_fairseq_model as dfm

    if getattr(dfm.DistributedDataParallel, "_tandem_cpu", False):
        return

    class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
        _tandem_cpu = True

        def __init__(self, module, *args, device_ids=None, output_device=None, **kwargs):
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            super().__init__(module, *args, device_ids=None if on_cpu else device_ids,
                             output_device=None if on_cpu else output_device, **kwargs)

    dfm.DistributedDataParallel = DistributedDataParallel


def shard_position(position: int, saved_shards: int | None, shards: int, shard_len: int) -> tuple[int, bool]:
    """(the batch to resume at in this rank's shard, whether the epoch is already over) for a
    checkpoint whose iterator stood at `position` of a shard when the epoch was split into
    `saved_shards` (one per rank; None: a checkpoint from before tandem recorded it). The ranks had
    consumed position × saved_shards of the epoch's batches together; with `shards` ranks each goes
    on at that share of its own shard (2 ranks at 8 of 10 → 4 ranks at 4 of 5). A position at or
    past the shard's end: the epoch is over, the next one begins.

    >>> shard_position(8, 2, 4, 5), shard_position(4, 4, 2, 10), shard_position(8, None, 4, 5)
    ((4, False), (8, False), (0, True))
    """
    if saved_shards and saved_shards != shards:
        position = position * saved_shards // shards
    if position >= shard_len:
        return 0, True
    return position, False


def iterator_position_across_world_sizes() -> None:
    """fairseq saves the training data iterator's place as `iterations_in_epoch`: batches of one
    rank's shard (the epoch's batches split one shard a rank). A checkpoint loaded by a different
    number of ranks reads it as batches of a shard of another length: fewer ranks (an elastic
    restart) repeat part of the epoch, more ranks (a host grown back, 2 → 4 ranks) find the
    place past their shard's end, and every rank dies with "Cannot resume training due to
    dataloader mismatch" (seen on the lab growing 2 hosts × 2 ranks back from v100a's 2 ranks).
    The iterator's state now records its shard count (`tandem_num_shards`), and a load scales the
    place to this run's shards (shard_position); a place past the end starts the next epoch, as
    fairseq's own state does at an epoch's end."""
    from fairseq.data import iterators

    cls = iterators.EpochBatchIterator
    if getattr(cls, "_tandem_shards", False):
        return
    state_dict, load_state_dict = cls.state_dict, cls.load_state_dict

    def with_shards(self):
        return {**state_dict(self), "tandem_num_shards": self.num_shards}

    def at_the_same_share(self, state):
        state = dict(state)
        saved = state.pop("tandem_num_shards", None)
        position = int(state.get("iterations_in_epoch", 0) or 0)
        if position > 0:
            self.epoch = state["epoch"]  # len(self) is of this epoch's batches
            position, over = shard_position(position, saved, self.num_shards, len(self))
            state["iterations_in_epoch"] = position
            if over:
                state["epoch"] = state["epoch"] + 1
        return load_state_dict(self, state)

    cls.state_dict, cls.load_state_dict = with_shards, at_the_same_share
    cls._tandem_shards = True


def epoch_resumes_with_the_sentences_left() -> None:
    """A batch position is no place in an epoch once the batches change: a restart on another world
    size derives another max_tokens (train.plan.batching), so fairseq's batches (sentences bucketed up to
    max_tokens, shuffled by epoch) are other batches, and any position skips or repeats sentences (big
    on 3x8 -> 2x8 GPUs resumed at 75% of an epoch saved at 50%). The iterator's state now records which
    of the dataset's sentences the epoch has consumed (`tandem_consumed`: one bit a sentence, 570 KB for
    WMT16's 4.56M pairs): the ranks had each taken their first `position` batches, the epoch's first
    position x ranks. A resume goes on with this epoch's batches, whatever their size, less those
    sentences: none skipped, none twice. Its own (shorter) epoch is then shuffled as fairseq shuffles one.
    Datasets that prefetch or shuffle in groups keep the share of the epoch (above)."""
    import numpy as np
    from fairseq.data import data_utils, iterators

    cls = iterators.EpochBatchIterator
    if getattr(cls, "_tandem_consumed", False):
        return
    ordered, state_dict, load_state_dict = cls.ordered_batches, cls.state_dict, cls.load_state_dict

    def ordered_without_consumed(self, epoch, fix_batches_to_gpus, shuffle):
        if self._supports_prefetch or self.grouped_shuffling:
            return ordered(self, epoch, fix_batches_to_gpus, shuffle)
        batches = list(self.frozen_batches)
        consumed = getattr(self, "_tandem_consumed_mask", None)
        if consumed is not None and getattr(self, "_tandem_consumed_epoch", None) == epoch:
            batches = batches_of_the_rest(self, batches, consumed)
        if shuffle:
            with data_utils.numpy_seed(self.seed + epoch):
                np.random.shuffle(batches)
        self._tandem_epoch_batches = (epoch, batches)  # every rank's, in the order the shards take them
        return list(iterators.ShardedIterator(batches, self.num_shards, self.shard_id, fill_value=[]))

    def with_consumed(self):
        state = state_dict(self)
        position, epoch = int(state.get("iterations_in_epoch") or 0), state.get("epoch")
        seen = getattr(self, "_tandem_epoch_batches", None)
        if position > 0 and seen is not None and seen[0] == epoch:
            mask = getattr(self, "_tandem_consumed_mask", None)
            if mask is None or getattr(self, "_tandem_consumed_epoch", None) != epoch:
                mask = np.zeros(len(self.dataset), dtype=bool)
            mask = mask.copy()
            for batch in seen[1][:position * self.num_shards]:
                mask[np.asarray(batch, dtype=np.int64)] = True
            state["tandem_consumed"] = np.packbits(mask).tobytes()
            state["tandem_sentences"] = len(mask)
        return state

    def load_consumed(self, state):
        state = dict(state)
        consumed, n = state.pop("tandem_consumed", None), state.pop("tandem_sentences", None)
        if consumed is not None and n == len(self.dataset) and int(state.get("iterations_in_epoch") or 0) > 0:
            self._tandem_consumed_mask = np.unpackbits(np.frombuffer(consumed, dtype=np.uint8))[:n].astype(bool)
            self._tandem_consumed_epoch = state["epoch"]
            state["iterations_in_epoch"] = 0  # this epoch again, from the start of what is left of it
            state.pop("tandem_num_shards", None)
        return load_state_dict(self, state)

    cls.ordered_batches, cls.state_dict, cls.load_state_dict = ordered_without_consumed, with_consumed, load_consumed
    cls._tandem_consumed = True
    batching_kept_with_iterators()


def batches_of_the_rest(iterator, batches: list, consumed) -> list:
    """The sentences of `batches` the epoch has not consumed, batched again as fairseq batched them
    (their length order, the iterator's max_tokens). The consumed sentences were another process's
    batches: fairseq makes an iterator's batches once, seeded with the epoch it is made in, so ranks
    that started in epoch 1 and ranks resuming in epoch 2 hold other batches (and another world size
    derives another max_tokens). Cut out of these batches, they left fragments: the lab's 2 x 2 run
    went on at 0.65x the sentences an update. Without the batching (an iterator fairseq's task did not
    make), the fragments, as before."""
    import numpy as np

    batching = getattr(iterator, "_tandem_batching", None)
    if batching is None or not hasattr(iterator.dataset, "batch_by_size"):
        return [kept for b in batches if len(kept := np.asarray(b)[~consumed[np.asarray(b, dtype=np.int64)]])]
    order = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    left = order[~consumed[order]]  # in the batches' order: by length, as fairseq ordered them
    return list(iterator.dataset.batch_by_size(left, **batching)) if len(left) else []


def batching_kept_with_iterators() -> None:
    """Each iterator fairseq's task makes remembers how its batches were made (max_tokens, max
    sentences, the batch size multiple), so that what is left of an epoch is batched the same way."""
    import inspect

    from fairseq.tasks.fairseq_task import FairseqTask

    get = FairseqTask.get_batch_iterator
    if getattr(get, "_tandem_batching", False):
        return
    signature = inspect.signature(get)

    def get_batch_iterator(self, *args, **kwargs):
        iterator = get(self, *args, **kwargs)
        given = signature.bind(self, *args, **kwargs)
        given.apply_defaults()
        iterator._tandem_batching = {name: given.arguments[name]
                                     for name in ("max_tokens", "max_sentences", "required_batch_size_multiple")}
        return iterator

    get_batch_iterator._tandem_batching = True  # type: ignore[attr-defined]
    FairseqTask.get_batch_iterator = get_batch_iterator


def atomic_checkpoint_copies() -> None:
    """fairseq writes a save to one file (atomically: a temporary name, then a rename) and copies it
    onto the others (checkpoint_last.pt, best) in place: a reader between the two sees half a file.
    The copies go to a temporary name and are renamed too, so checkpoint_last.pt is always a whole
    file, and a hard link to it (the keeper's snapshot, train.agent.keeper.replica) stays whole."""
    import shutil

    from fairseq.file_io import PathManager

    if getattr(PathManager.copy, "_tandem_atomic", False):
        return
    copy = PathManager.copy

    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if "://" in str(dst_path):  # a remote store: iopath's own copy
            return copy(src_path, dst_path, overwrite)
        tmp = f"{dst_path}.tandem-copy"
        shutil.copyfile(src_path, tmp)
        os.replace(tmp, dst_path)
        return True

    atomic_copy._tandem_atomic = True  # type: ignore[attr-defined]
    PathManager.copy = staticmethod(atomic_copy)


def saves_alone(trainer) -> str:
    """Why rank 0 cannot save alone (a save there would wait in a collective the other ranks never
    join), or '' when it can. fairseq 0.12's save (checkpoint_utils.save_checkpoint, then
    trainer.save_checkpoint) is collective only where: the optimizer is sharded (OSS's
    consolidate_state_dict), FSDP gathers the state, every rank saves (base layers, sharded state), or
    local SGD averages the ranks before each save (train.agent.trainer.comm_local_sgd)."""
    if trainer.data_parallel_world_size <= 1:
        return ""
    if trainer.is_fsdp:
        return "FSDP gathers its state on every rank"
    if hasattr(trainer.optimizer.optimizer, "consolidate_state_dict") \
            and not trainer.cfg.checkpoint.no_save_optimizer_state:
        return "the sharded optimizer gathers its state on every rank"
    if getattr(trainer.cfg.model, "base_layers", 0) > 0:
        return "every rank saves its base layers"
    from fairseq.optim.bmuf import FairseqBMUF

    if isinstance(trainer.optimizer, FairseqBMUF):
        return "local SGD averages every rank before a save"
    return ""


def save_now_on_signal() -> None:
    """A host of the run is about to be reclaimed (a spot VM's notice, train.agent.keeper.preemption): its
    keeper, or rank 0's, sends rank 0's process SAVE_NOW_SIGNAL, and rank 0 saves checkpoint_last at
    the end of the update it is in, without validating, then trains on. The keepers copy that save
    as any other, and the next generation resumes from it without the leaving host. fairseq's save
    involves no collective in tandem's runs (saves_alone), so rank 0 alone needs the signal; rank 0
    writes its pid in the save directory (preemption.RANK0_PID) once its first update is done. A
    save fairseq made at that update already is not made twice."""
    import logging
    import signal
    import threading

    from fairseq import checkpoint_utils
    from fairseq_cli import train as cli

    from train.agent.keeper import preemption

    validate_and_save = cli.validate_and_save
    if getattr(validate_and_save, "_tandem_save_now", False):
        return
    asked, noted = threading.Event(), []
    signal.signal(preemption.SAVE_NOW_SIGNAL, lambda *_: asked.set())
    logger = logging.getLogger("fairseq_cli.train")

    def stamp(path: str):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def and_now_if_asked(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
        before = stamp(last)
        said = validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        if trainer.data_parallel_rank != 0:
            asked.clear()
            return said
        if not noted:
            preemption.note_rank0(cfg.checkpoint.save_dir)
            noted.append(True)
        if asked.is_set():
            asked.clear()
            why = "" if stamp(last) == before else "saved at this update already"
            why = why or saves_alone(trainer) or ("--no-save" if cfg.checkpoint.no_save else "")
            if why:
                logger.info(f"tandem: a save now was asked (a host of the run is leaving): not made, {why}")
            else:
                logger.info(f"tandem: saving now at update {trainer.get_num_updates()} (a host of the run is "
                            "leaving), without validation")
                checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
        return said

    and_now_if_asked._tandem_save_now = True  # type: ignore[attr-defined]
    cli.validate_and_save = and_now_if_asked


def comm_hook_modules() -> list[str]:
    """The communication strategies' host-side hooks: train/agent/trainer/comm_*.py, one module per strategy
    (train.recipe.strategies says which a run uses; each hook acts only when its run asks for it)."""
    import pkgutil

    import train.agent.trainer

    return sorted(f"train.agent.trainer.{m.name}" for m in pkgutil.iter_modules(train.agent.trainer.__path__)
                  if m.name.startswith("comm_"))


def install_comm_hooks() -> None:
    """Every strategy's hook installed (after ddp_on_cpu: a hook may wrap its DistributedDataParallel)."""
    import importlib

    for name in comm_hook_modules():
        importlib.import_module(name).install()


def main() -> None:
    # fairseq_cli.train sets up fairseq's log format when imported: before anything else logs.
    from fairseq_cli.train import cli_main

    checkpoints_as_data.install()
    patch_parser()
    ddp_on_cpu()
    attention_without_cudnn()
    process_group_timeout()
    heartbeat_kills()
    iterator_position_across_world_sizes()
    epoch_resumes_with_the_sentences_left()
    atomic_checkpoint_copies()
    install_comm_hooks()
    fast_steps.install_fused_adam()
    fast_steps.install_flat_master_copy()
    fused_loss.install()
    compiled_layers.install()
    save_now_on_signal()
    if os.environ.get("TANDEM_PROFILE"):  # train/agent/trainer/profile.py: a window of updates profiled
        from train.agent.trainer import profile

        profile.install(os.environ["TANDEM_PROFILE"])
    cli_main()


if __name__ == "__main__":
    main()
