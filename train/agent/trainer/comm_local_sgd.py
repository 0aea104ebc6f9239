"""--comm local-sgd:H's host-side hooks (train.recipe.strategies.local_sgd): fairseq's BMUF, with
what fairseq 0.12's lacks. `install()` patches fairseq's classes (train.agent.trainer.fairseq_train calls it
for every run; the patches act only where BMUF runs):

- its outer state is saved in checkpoints, and its first updates can be synchronous
  (TANDEM_LOCAL_SGD_SYNC_UPDATES), on the true (unscaled) gradients;
- under fp16 its ranks agree on a loss-scale overflow and skip it together, and the fp16 model holds
  the average after a sync (what a checkpoint saves, validation runs);
- every checkpoint save is a sync; its sync is one flat all-reduce.
"""

from __future__ import annotations

import os

SYNC_UPDATES_VARIABLE = "TANDEM_LOCAL_SGD_SYNC_UPDATES"  # updates averaged as sync's first, 0 or unset: none


def install() -> None:
    local_sgd_state_in_checkpoints()
    local_sgd_synchronous_start()
    local_sgd_agrees_on_overflow()
    local_sgd_saves_the_average()
    weights_logged_at_syncs()
    local_sgd_syncs_at_every_save()


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
    until = int(os.environ.get(SYNC_UPDATES_VARIABLE) or 0)
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

    until = int(os.environ.get(SYNC_UPDATES_VARIABLE) or 0)
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
