"""fairseq-train with fairseq 0.12's device and failure assumptions fixed: tandem starts every run with it.

    python -m train.agent.fairseq_train DATA ...      (the same arguments as fairseq-train)

- `--bf16` means bfloat16 on the GPU, not on a TPU (below);
- attention on a GPU does not use cuDNN's kernels (below);
- the process group times out with the run's heartbeat, not NCCL's 10 minutes, and the heartbeat
  kills a rank stuck in a collective instead of interrupting it (below);
- `--ddp-backend pytorch_ddp` works on CPU hosts: fairseq hands DistributedDataParallel
  `device_ids=[device_id]`, which torch refuses for a CPU module, so CPU runs could only use
  legacy_ddp, whose all-reduce never overlaps the backward pass. The lab measures that overlap
  (benchmarks.step) with this.

- local SGD's outer state (fairseq's BMUF) is saved in checkpoints (below), and its first updates
  can be synchronous (TANDEM_LOCAL_SGD_SYNC_UPDATES, below), on the true (unscaled) gradients;
  under fp16 its ranks agree on a loss-scale overflow and skip it together, and the fp16 model
  holds the average after a sync (what a checkpoint saves, validation runs) (below).
- a checkpoint resumes on another number of ranks (an elastic restart, a host grown back): the
  data iterator's place in the epoch is kept as a share of the epoch, not as a count of one
  rank's batches (below).

On GPUs Adam's step and fp16's master copy take a few kernels instead of a few per tensor
(train/agent/fast_steps.py).

With TANDEM_PROFILE=FIRST:COUNT:DIR it also profiles a window of updates (train/agent/profile.py).

fairseq 0.12 ties `--bf16` to TPUs: `options.add_defaults` sets `tpu=True`, and
`distributed_init` then imports torch_xla, which a GPU host lacks, so every rank dies at start.
The rest of fairseq already does bf16 on a GPU: the trainer casts the model to bfloat16 and
FP16Optimizer keeps fp32 master weights, with no loss scaling for bf16. This entry point parses
the arguments as fairseq-train does and clears `tpu` again when CUDA is the device; everything
else is fairseq-train itself.
"""

from __future__ import annotations

import os

from train.agent import fast_steps


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
    (tandem sets it to the run's heartbeat) becomes the default timeout instead."""
    seconds = os.environ.get("TANDEM_PG_TIMEOUT_S")
    if not seconds:
        return
    import datetime

    import torch.distributed as dist

    init = dist.init_process_group
    if getattr(init, "_tandem_timeout", False):
        return

    def init_process_group(*args, **kwargs):
        kwargs.setdefault("timeout", datetime.timedelta(seconds=float(seconds)))
        return init(*args, **kwargs)

    init_process_group._tandem_timeout = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def heartbeat_kills() -> None:
    """fairseq's heartbeat (--heartbeat-timeout) sends its own process SIGINT. A rank whose peer
    vanished is blocked inside a collective, in C++, and never runs Python's handler: it logs
    "Killing job for not making progress" and stays (seen for > 240 s on the lab, torchrun and
    all). SIGKILL ends it wherever it is; torchrun then ends the host's part of the run."""
    import signal

    from fairseq.distributed import distributed_timeout_wrapper as wrapper

    cls = wrapper.DistributedTimeoutWrapper
    if getattr(cls, "_tandem_kill", False):
        return
    init = cls.__init__

    def __init__(self, module, timeout, signal=signal.SIGKILL):
        init(self, module, timeout, signal)

    cls.__init__ = __init__
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


def local_sgd_state_in_checkpoints() -> None:
    """fairseq's BMUF (--comm local-sgd:H) keeps the last synced model and its outer (block)
    momentum outside the optimizer's state_dict, so a resumed or elastically restarted run lost
    its momentum and measured its next delta from the wrong model. They ride along in the
    optimizer state now (`tandem_bmuf`, fp32 on CPU), and come back when it is loaded. Its sync
    all-reduces one flat buffer (below)."""
    import torch
    from fairseq.optim.bmuf import FairseqBMUF

    if getattr(FairseqBMUF, "_tandem_state", False):
        return
    state_dict, load_state_dict = FairseqBMUF.state_dict, FairseqBMUF.load_state_dict

    def with_outer_state(self):
        state = dict(state_dict(self))
        # BMUF counts its own updates and fairseq restores only the trainer's: a resume began at 0
        # (the synchronous start again, the syncs shifted off the checkpoint interval)
        state["tandem_bmuf_updates"] = self.get_num_updates()
        if self.block_momentum == 0:  # a plain average keeps no outer state: no 2 × the model's size to save
            return state
        state["tandem_bmuf"] = {"global_params": [p.detach().cpu() for p in self.global_params],
                                "smoothed_grads": [g.detach().cpu() for g in self.smoothed_grads]}
        return state

    def load_outer_state(self, state, optimizer_overrides=None):
        state = dict(state)
        outer = state.pop("tandem_bmuf", None)
        updates = state.pop("tandem_bmuf_updates", None)
        load_state_dict(self, state, optimizer_overrides)
        if isinstance(updates, int):
            self.set_num_updates(updates)
        if outer and len(outer["global_params"]) == len(self.global_params):
            with torch.no_grad():
                for mine, saved in zip(self.global_params, outer["global_params"], strict=True):
                    mine.copy_(saved.to(mine.device, mine.dtype))
                for mine, saved in zip(self.smoothed_grads, outer["smoothed_grads"], strict=True):
                    mine.copy_(saved.to(mine.device, mine.dtype))

    FairseqBMUF.state_dict, FairseqBMUF.load_state_dict = with_outer_state, load_outer_state
    FairseqBMUF._avg_grad_from_all_gpus = _average_in_one_all_reduce
    reset = FairseqBMUF._reset_local_data

    def outer_state_only_with_momentum(self) -> None:
        """BMUF's last synced model, its momentum and its delta: three fp32 copies of the model
        (Transformer big: 2.5 GB a GPU) that only the outer momentum reads. A plain average
        (block_momentum 0, tandem's default) keeps none of them."""
        if self.block_momentum != 0:
            return reset(self)
        self.global_params, self.smoothed_grads, self.grads = [], [], []

    FairseqBMUF._reset_local_data = outer_state_only_with_momentum
    FairseqBMUF._tandem_state = True


def _average_in_one_all_reduce(self) -> None:
    """BMUF's sync, as fairseq's (the deltas, or the parameters without block momentum, averaged
    over the ranks) in one all-reduce of one flat buffer instead of one per tensor: a Transformer
    has a hundred or more, each a round trip, which on the lab cost seconds per sync."""
    _average([p.data for p in self.params] if self.block_momentum == 0 else self.grads)


def local_sgd_synchronous_start() -> None:
    """Local SGD (BMUF) whose first TANDEM_LOCAL_SGD_SYNC_UPDATES updates are synchronous: before
    each of them the gradients are averaged over the ranks, as sync's all-reduce does, so every
    rank takes the same step with the same Adam state; BMUF's own syncs every H updates then
    average identical models. After those updates each rank steps alone between syncs. (fairseq's
    BMUF `warmup_iterations` is not that: its ranks train alone until then, and rank 0's model is
    broadcast at its end.) The gradients averaged are the true ones: under fp16 FP16Optimizer
    applies the loss scale and 1/sample size lazily (its `_multiply_factor`, its own on each rank),
    so the master gradients are unscaled first; averaging the scaled ones had each rank then divide
    by its own factor, and the ranks' steps and Adam states differed."""
    until = int(os.environ.get("TANDEM_LOCAL_SGD_SYNC_UPDATES") or 0)
    if until <= 0:
        return
    from fairseq.optim.bmuf import FairseqBMUF

    if getattr(FairseqBMUF, "_tandem_sync_start", False):
        return
    step = FairseqBMUF.step

    def step_after_averaging(self, closure=None):
        if self.get_num_updates() < until and self.world_size > 1:
            inner = self._optimizer
            if hasattr(inner, "_sync_fp16_grads_to_fp32"):  # FP16Optimizer (fp16, bf16)
                inner._sync_fp16_grads_to_fp32()
            if hasattr(inner, "_unscale_grads"):  # the pending scale applied: the factor is 1 now
                inner._unscale_grads()
            _average([p.grad for p in self.params if p.grad is not None])
        return step(self, closure)

    FairseqBMUF.step = step_after_averaging
    FairseqBMUF._tandem_sync_start = True


def local_sgd_agrees_on_overflow() -> None:
    """Under fp16 each rank's loss scaler checks its own gradients for an overflow (in
    clip_grad_norm) and the trainer skips the update where it finds one. Sync training all-reduces
    the gradients first, so all ranks see the same; local SGD does not: one rank skipped, its
    update count fell behind, and at the next sync, validation or max_update the ranks issued
    different collectives (a hang until the timeout, then a healthy host dropped). The ranks now
    all-reduce the overflow flag (one element) before stepping: one overflow skips the update on
    every rank, and every scaler lowers its scale alike. Only where a scaler exists (fp32 and bf16
    have none: no overflow to agree on) or a test injects one (TANDEM_TEST_OVERFLOW, below).

    Two failures are agreed on too, so that no rank waits in a collective for one that left (then
    a healthy host is blamed): a rank whose scaler reached its minimum raises FloatingPointError
    (fairseq's "Minimum loss scale reached"), and every rank raises it, naming that rank; a
    non-finite gradient norm where no scaler exists (bf16, fp32) is skipped as an overflow by every
    rank (fairseq would raise on that rank alone). TANDEM_TEST_FATAL=RANK:UPDATE injects the first."""
    from fairseq.optim.bmuf import FairseqBMUF

    if getattr(FairseqBMUF, "_tandem_overflow", False):
        return
    clip = FairseqBMUF.clip_grad_norm
    injected = _injected_overflows()
    fatal_at = _injected_overflows("TANDEM_TEST_FATAL")

    def clip_agreeing_on_overflow(self, max_norm, aggregate_norm_fn=None):
        import torch
        import torch.distributed as dist

        scaler = getattr(self._optimizer, "scaler", None)
        overflow, fatal, norm = None, None, None
        try:
            if injected(self.get_num_updates()):
                raise OverflowError("injected by TANDEM_TEST_OVERFLOW")
            if fatal_at(self.get_num_updates()):
                raise FloatingPointError("Minimum loss scale reached (injected by TANDEM_TEST_FATAL)")
            norm = clip(self, max_norm, aggregate_norm_fn)
        except OverflowError as error:
            overflow = error
        except FloatingPointError as error:
            fatal = error
        if overflow is None and fatal is None and scaler is None and norm is not None \
                and not torch.isfinite(torch.as_tensor(norm)).all():
            overflow = OverflowError(f"gradient norm {float(norm)} on rank {dist.get_rank()}: skipped on every rank")
        if self.world_size <= 1:
            if fatal is not None:
                raise fatal
            if overflow is not None:
                raise overflow
            return norm
        device = next(iter(self.params)).device
        worst = _max_over_ranks(2 + dist.get_rank() if fatal is not None else 1 if overflow is not None else 0,
                                device)  # the same on every rank: 0 step, 1 skip, 2+R rank R cannot go on
        if worst >= 2:  # the same words on every rank: `fab status` then blames no host
            raise FloatingPointError(f"rank {worst - 2}: minimum loss scale reached; every rank stops with it "
                                     "(the loss diverged: lower the learning rate or clip the gradients)")
        if worst == 1 and overflow is None:
            overflow = OverflowError("another rank's gradients overflowed")
            if scaler is not None:
                try:  # the scale lowered as on the rank that overflowed
                    scaler.check_overflow(float("inf"))
                except OverflowError as error:
                    overflow = OverflowError(f"another rank's gradients overflowed; {error}")
        if overflow is not None:
            raise overflow
        return norm

    FairseqBMUF.clip_grad_norm = clip_agreeing_on_overflow
    FairseqBMUF._tandem_overflow = True


def _max_over_ranks(value: int, device) -> int:
    import torch
    import torch.distributed as dist

    mine = torch.tensor([float(value)], device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return int(mine.item())


def _injected_overflows(variable: str = "TANDEM_TEST_OVERFLOW"):
    """Test-only: TANDEM_TEST_OVERFLOW=RANK:UPDATE[:UPDATE...] has that rank's loss scaler report
    an overflow once at each of those updates (fp16 cannot run on the lab's CPU hosts, its scaler's
    OverflowError can). The trainer's overflow branch puts a 0 on the GPU (`.cuda()`), which a CPU
    host lacks: there it stays on the CPU."""
    spec = os.environ.get(variable, "")
    rank, _, updates = spec.partition(":")
    pending = {int(u) for u in updates.split(":") if u}

    def fires(update: int) -> bool:
        import torch.distributed as dist

        if update in pending and dist.get_rank() == int(rank):
            pending.discard(update)
            return True
        return False

    fires.active = bool(spec)  # type: ignore[attr-defined]
    if spec:
        import torch

        if not torch.cuda.is_available():
            torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    return fires


def local_sgd_saves_the_average() -> None:
    """BMUF averages the fp32 master parameters after FP16Optimizer's step has already copied them
    to the fp16 model: at a sync update the model (what the checkpoint saves and validation runs)
    held each rank's own un-averaged weights until the next step, and a resume lost the average.
    The fp16/bf16 model is refreshed from the averaged master right after the sync."""
    from fairseq.optim.bmuf import FairseqBMUF

    if getattr(FairseqBMUF, "_tandem_refresh", False):
        return
    block_sync = FairseqBMUF._block_sync

    def sync_then_refresh(self):
        block_sync(self)
        if hasattr(self._optimizer, "_sync_fp32_params_to_fp16"):
            self._optimizer._sync_fp32_params_to_fp16()

    FairseqBMUF._block_sync = sync_then_refresh
    FairseqBMUF._tandem_refresh = True


def sync_before_save(optimizer) -> bool:
    """Local SGD's ranks averaged now, unless this update was a sync already: what a checkpoint then
    saves is the average whatever H is (an interval, an epoch's end, the last update). Every rank
    saves at the same update (fairseq decides it from the update count and the epoch), so every
    rank takes part. True when it synced."""
    from fairseq.optim.bmuf import FairseqBMUF

    if not isinstance(optimizer, FairseqBMUF) or optimizer.world_size <= 1:
        return False
    if optimizer.get_num_updates() <= optimizer.warmup_iteration or optimizer._is_bmuf_iter():
        return False
    optimizer._block_sync()
    return True


def local_sgd_syncs_at_every_save() -> None:
    """fairseq saves at its own updates (interval, epoch end, the end), which `--comm auto`'s H (136,
    291, ...) rarely divides: a checkpoint held rank 0's un-averaged weights. Every save is a sync now."""
    from fairseq import checkpoint_utils

    save = checkpoint_utils.save_checkpoint
    if getattr(save, "_tandem_sync", False):
        return

    def save_after_sync(cfg, trainer, epoch_itr, val_loss):
        if not cfg.no_save:
            sync_before_save(trainer.optimizer)
        return save(cfg, trainer, epoch_itr, val_loss)

    save_after_sync._tandem_sync = True  # type: ignore[attr-defined]
    checkpoint_utils.save_checkpoint = save_after_sync


def weights_digest(state: dict) -> str:
    """A digest of a model's state_dict (as fp32): equal on two ranks, or in a checkpoint, when the
    weights are."""
    import hashlib

    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def weights_logged_at_syncs() -> None:
    """Test-only: TANDEM_TEST_WEIGHTS_LOG=DIR has every rank append {update, digest} of its model
    to DIR/rank<R>.jsonl after each update that ends the synchronous start or is a sync, so a test
    compares the ranks' weights (and a checkpoint's) there."""
    out = os.environ.get("TANDEM_TEST_WEIGHTS_LOG")
    if not out:
        return
    import json

    import torch.distributed as dist
    from fairseq.trainer import Trainer

    until = int(os.environ.get("TANDEM_LOCAL_SGD_SYNC_UPDATES") or 0)
    train_step = Trainer.train_step

    def step_and_log(self, *args, **kwargs):
        before = self.get_num_updates()
        result = train_step(self, *args, **kwargs)
        n, every = self.get_num_updates(), self.cfg.bmuf.global_sync_iter
        if n != before and (n == until or n % every == 0):
            os.makedirs(out, exist_ok=True)
            with open(f"{out}/rank{dist.get_rank()}.jsonl", "a") as log:
                log.write(json.dumps({"update": n, "digest": weights_digest(self.get_model().state_dict())}) + "\n")
        return result

    Trainer.train_step = step_and_log


def _average(tensors) -> None:
    """Every tensor replaced by its mean over the ranks, in one all-reduce of one flat buffer."""
    import torch
    import torch.distributed as dist

    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors]).div_(float(dist.get_world_size()))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


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
    size derives another max_tokens (train.run.batching), so fairseq's batches (sentences bucketed up to
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
            batches = [kept for b in batches if len(kept := np.asarray(b)[~consumed[np.asarray(b, dtype=np.int64)]])]
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


def atomic_checkpoint_copies() -> None:
    """fairseq writes a save to one file (atomically: a temporary name, then a rename) and copies it
    onto the others (checkpoint_last.pt, best) in place: a reader between the two sees half a file.
    The copies go to a temporary name and are renamed too, so checkpoint_last.pt is always a whole
    file, and a hard link to it (the keeper's snapshot, train.agent.replica) stays whole."""
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


def main() -> None:
    # fairseq_cli.train sets up fairseq's log format when imported: before anything else logs.
    from fairseq_cli.train import cli_main

    patch_parser()
    ddp_on_cpu()
    attention_without_cudnn()
    process_group_timeout()
    heartbeat_kills()
    local_sgd_state_in_checkpoints()
    local_sgd_synchronous_start()
    local_sgd_agrees_on_overflow()
    local_sgd_saves_the_average()
    weights_logged_at_syncs()
    iterator_position_across_world_sizes()
    epoch_resumes_with_the_sentences_left()
    atomic_checkpoint_copies()
    local_sgd_syncs_at_every_save()
    fast_steps.install_fused_adam()
    fast_steps.install_flat_master_copy()
    if os.environ.get("TANDEM_PROFILE"):  # train/agent/profile.py: a window of updates profiled
        from train.agent import profile

        profile.install(os.environ["TANDEM_PROFILE"])
    cli_main()


if __name__ == "__main__":
    main()
