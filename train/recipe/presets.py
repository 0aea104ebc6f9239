"""Training presets: named sets of fairseq-train options, and type-checked overrides.

A preset maps fairseq option names (underscores, as in `--set max_update=300000`) to
values; `train.run.command` turns them into `--max-update 300000`. Values are typed: an
override must parse as the preset value's type (bool options are flags).

    >>> p = resolve("tiny", ["max_update=200", "lr=0.002"])
    >>> p.options["max_update"], p.options["lr"]
    (200, 0.002)

Presets:
- `tiny`: 64-dim, 2+2 layers, 0.3M parameters; learns the synthetic corpus (train.agent.data.synthetic,
  1000-piece joint sentencepiece vocabulary) on CPU. Two processes on a shared 2-core
  machine: 300 updates in ≈3 min (0.35–0.5 s/update), BLEU 0 untrained → 0.4 at 100
  updates → 50 at 200 → 74 at 300 (→ 92 at 600).
- `transformer_wmt_en_de`: Transformer base (Vaswani et al. 2017), ≈61M parameters
  with a 32k joint vocabulary; lr 7e-4, 4000 warmup updates; 32,768 tokens per update (RECIPES);
  100,000 updates, the paper's (3.3 B tokens: ≈ 21 WMT16 epochs, by big's 70 in 11 B).
- `transformer_vaswani_wmt_en_de_big`: Transformer big as in fairseq's "Scaling NMT"
  recipe (Ott et al. 2018): lr 1e-3 (its rate for big batches), dropout 0.3; 458,752 tokens per
  update, as their 8-GPU run (3,584 tokens per GPU, `--update-freq 16` to simulate 128 GPUs);
  24,000 updates, where their large-batch run reached 29.3 BLEU (11 B tokens, ≈ 70 epochs).

max_tokens is the batch of a CPU host (and the cap where GPU memory is not known yet); on GPUs
`fab train` derives max_tokens and update_freq from tokens_per_update (train.plan.batching).

Every preset: Adam (0.9, 0.98), inverse-sqrt schedule with linear warmup, label-smoothed
cross entropy (0.1), shared embeddings (joint dictionary), the 5 best checkpoints by
validation loss kept plus the last, JSON logs, TensorBoard logs. `{log_dir}` and
`{save_dir}` in a value are filled in by the command builder.

Bounded loss: a resume (and an elastic restart) redoes at most one `save_interval_updates` of
training. `fab train` chooses it for the run (train.run.interval.choose): ~10 minutes of the run's
measured step, else of the step its preset's REFERENCE predicts for its batch and GPU; a
`--set save_interval_updates=N` wins. The values here are what it chooses on the reference hardware:
tiny 50 updates, fixed (≈ 25 s on the lab, whose tests resume past update 50); base 2,000 ≈ 6 min
and big 100 ≈ 7 min at twice an H100's measured step at the recipe's batch on one GPU (0.0875 s
and 2.12 s: the network may take at most half of a step that `fab train` starts).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import strategies
from .link_time import allreduce_bytes_per_host, collective_timeout_s
from .params import preset_params

Value = bool | int | float | str | None

COMMON: dict[str, Value] = {
    "task": "translation",
    "source_lang": "en",
    "target_lang": "de",
    "share_all_embeddings": True,
    "optimizer": "adam",
    "adam_betas": "(0.9, 0.98)",
    "clip_norm": 0.0,
    "weight_decay": 0.0,
    "lr_scheduler": "inverse_sqrt",
    "warmup_init_lr": 1e-07,
    "criterion": "label_smoothed_cross_entropy",
    "label_smoothing": 0.1,
    "keep_best_checkpoints": 5,
    "best_checkpoint_metric": "loss",
    "keep_interval_updates": 1,
    "no_epoch_checkpoints": True,
    "log_format": "json",
    "tensorboard_logdir": "{log_dir}/tensorboard",
    "seed": 1,
    # A rank whose peer died waits in all_reduce for gloo's 30 min (NCCL's 10): fairseq's heartbeat
    # kills a rank that makes no progress for this long instead, and the process group's timeout
    # (train.agent.trainer.fairseq_train) ends a collective that waits longer. At least this; more where
    # a checkpoint save takes longer (failure_timeout_s).
    "heartbeat_timeout": 45,
}

PRESETS: dict[str, dict[str, Value]] = {
    "tiny": {
        **COMMON,
        "arch": "transformer",
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_embed_dim": 64,
        "decoder_embed_dim": 64,
        "encoder_ffn_embed_dim": 256,
        "decoder_ffn_embed_dim": 256,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "dropout": 0.1,
        "lr": 0.007,
        "warmup_updates": 100,
        "max_tokens": 2048,
        "max_update": 300,
        "save_interval_updates": 50,  # 50 × 0.5 s = 25 s on the lab
        "log_interval": 10,
        "num_workers": 0,
    },
    "transformer_wmt_en_de": {
        **COMMON,
        "arch": "transformer_wmt_en_de",
        "dropout": 0.1,
        "lr": 0.0007,
        "warmup_updates": 4000,
        "max_tokens": 4096,
        "tokens_per_update": 32768,  # RECIPES: Vaswani et al. 2017 as fairseq runs it, 8 GPUs x 4,096
        # Vaswani et al. 2017 (5.1, 5.2): base trained 100,000 steps of ~25k source + 25k target tokens.
        # 32,768 max_tokens units hold ~27.5k target tokens (benchmarks/README.md: 27,455 words a batch),
        # so this is the paper's step count (what the inverse-sqrt schedule counts) at ~1.1x its tokens.
        "max_update": 100000,
        # fab train derives it from the run's step (train.run.interval.choose); on one H100 a rank:
        # 2,000 × 0.175 s = 6 min (train.run.interval.REFERENCE)
        "save_interval_updates": 2000,
        "log_interval": 100,
        "num_workers": 1,
    },
    "transformer_vaswani_wmt_en_de_big": {
        **COMMON,
        "arch": "transformer_vaswani_wmt_en_de_big",
        "dropout": 0.3,
        # the recipe's rate at its batch: examples/scaling_nmt, "0.001 works well for big batches" (its
        # 8-GPU command says 0.0005 at update-freq 1, 28,672 tokens; tandem trains the 128-GPU batch)
        "lr": 0.001,
        "warmup_updates": 4000,
        "max_tokens": 3584,
        "tokens_per_update": 458752,  # RECIPES: Ott et al. 2018, 8 GPUs x 3,584 x update-freq 16
        # Ott et al. 2018 reached 29.3 BLEU (WMT16 train, newstest2014) in "70 epochs or ~24k steps using
        # the large batch size" (M. Ott, github.com/facebookresearch/fairseq/issues/1976), at lr 0.001
        # (examples/scaling_nmt: "0.001 works well for big batches", above). 300,000 is Vaswani et al.'s
        # count for big at 25k tokens a batch: 12x too long at this batch.
        "max_update": 24000,
        # fab train derives it from the run's step (train.run.interval.choose); on one H100 a rank:
        # 100 × 4.24 s = 7 min (train.run.interval.REFERENCE)
        "save_interval_updates": 100,
        "log_interval": 100,
        "num_workers": 1,
    },
}

# fairseq options a preset does not set but that may be overridden, with their types.
# (`train.run.command` sets the launch-related ones itself: data, save_dir, distributed_*,
# update_freq, fp16/bf16, cpu.)
EXTRA_OPTIONS: dict[str, type] = {
    # W&B through fairseq's own logging (its key: WANDB_API_KEY in the controller's environment, passed to
    # the hosts' keepers in memory only: train.agent.trainer.tracker)
    "wandb_project": str,
    "attention_dropout": float,
    "activation_dropout": float,
    "activation_fn": str,
    "encoder_layers": int,
    "decoder_layers": int,
    "encoder_embed_dim": int,
    "decoder_embed_dim": int,
    "encoder_ffn_embed_dim": int,
    "decoder_ffn_embed_dim": int,
    "encoder_attention_heads": int,
    "decoder_attention_heads": int,
    "encoder_normalize_before": bool,
    "decoder_normalize_before": bool,
    "encoder_learned_pos": bool,
    "decoder_learned_pos": bool,
    "share_decoder_input_output_embed": bool,
    "max_epoch": int,
    "max_sentences": int,
    "batch_size": int,
    "batch_size_valid": int,
    "max_tokens_valid": int,
    "max_source_positions": int,
    "max_target_positions": int,
    "skip_invalid_size_inputs_valid_test": bool,
    "patience": int,
    "validate_interval_updates": int,
    "validate_after_updates": int,
    "disable_validation": bool,
    "no_save": bool,
    "no_last_checkpoints": bool,
    "fp16_init_scale": int,
    "memory_efficient_fp16": bool,
    "min_lr": float,
    "stop_min_lr": float,
    "reset_optimizer": bool,
    "reset_lr_scheduler": bool,
    "reset_dataloader": bool,
    "reset_meters": bool,
    "restore_file": str,
    "finetune_from_model": str,
    "eval_bleu": bool,
    "num_batch_buckets": int,
    "required_batch_size_multiple": int,
    "empty_cache_freq": int,
    "bucket_cap_mb": int,
    "ddp_backend": str,
    "heartbeat_timeout": int,
    # each communication strategy's own (local-sgd's BMUF outer step, its synchronous start, ...): passed
    # to fairseq only for that strategy, some never (train.recipe.strategies)
    **strategies.options(),
    "report_accuracy": bool,
    "tokens_per_update": int,  # tandem's own: the batch to derive max_tokens/update_freq for (train.plan.batch)
    # tandem's own, on GPUs (train/agent/trainer/fast_steps.py): torch's fused AdamW for fairseq's Adam, and
    # fp16's master copy in a few kernels instead of a few per tensor; on unless set false. Off unless
    # set true (not yet measured on a GPU): the loss from the logits (train/agent/trainer/fused_loss.py), each
    # Transformer layer through torch.compile (train/agent/trainer/compiled_layers.py)
    "fused_adam": bool,
    "flat_master_copy": bool,
    "fused_loss": bool,
    "compile_layers": bool,
    # tandem's own, the hosts' keepers (train.agent.keeper.generation): the ranks restarted at most this often
    # an hour before the run stops (3, as torchrun's --max-restarts counts), and a host whose link flaps
    # taken back at most this often an hour (6) while the others train on without it
    "restarts_per_hour": int,
    "rejoins_per_hour": int,
}

# The batch each preset's recipe trains with, in max_tokens units (padded tokens of the longer side:
# what fairseq's --max-tokens counts), and where it comes from. tandem derives max_tokens and
# update_freq for the cluster at hand from it (train.plan.batch), so that 2 hosts x 1 V100 and
# 2 hosts x 8 H100 train with the same batch. tiny has none: the lab's demo keeps max_tokens per rank
# (`--set tokens_per_update=N` gives it one).
RECIPES: dict[str, str] = {
    "transformer_wmt_en_de": "Vaswani et al. 2017 (base): ~25k source + 25k target tokens a batch; fairseq's "
                             "recipe, 8 GPUs x 4,096 max_tokens = 32,768",
    "transformer_vaswani_wmt_en_de_big": "Ott et al. 2018 \"Scaling NMT\": 8 GPUs x 3,584 max_tokens x update-freq 16 "
                                         "= 458,752 (~400k target tokens after padding)",
}

# tandem's counts where a negative number means nothing (parse_value refuses it; 0 is "never").
NOT_NEGATIVE = {"restarts_per_hour", "rejoins_per_hour"}

# Options tandem reads itself and never passes to fairseq.
TANDEM_OPTIONS = {"tokens_per_update", "fused_adam", "flat_master_copy", "fused_loss", "compile_layers",
                  "restarts_per_hour", "rejoins_per_hour"}

# Option names the launcher owns; overriding them would break the command's consistency.
RESERVED = {
    "data",
    "save_dir",
    "cpu",
    "fp16",
    "bf16",
    "update_freq",
    "distributed_world_size",
    "distributed_rank",
    "distributed_init_method",
    "distributed_no_spawn",
    "distributed_backend",
    "distributed_port",
    "device_id",
}


class OverrideError(ValueError):
    """An override that names no known option, or whose value has the wrong type."""


@dataclass(frozen=True)
class Preset:
    """A preset with its overrides applied: `options` holds fairseq option values."""

    name: str
    options: dict[str, Value] = field(default_factory=dict)



def option_type(preset: Mapping[str, Value], key: str) -> type:
    """The type an override of `key` must have, or OverrideError naming close matches."""
    if key in RESERVED:
        raise OverrideError(f"`{key}` is set by the launcher (use its own option), not by --set")
    if key in preset and preset[key] is not None:
        value = preset[key]
        return type(value)
    if key in EXTRA_OPTIONS:
        return EXTRA_OPTIONS[key]
    known = sorted(set(preset) | set(EXTRA_OPTIONS))
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise OverrideError(
        f"unknown option `{key}`{hint} (known: the preset's options and "
        f"train.recipe.presets.EXTRA_OPTIONS; write names with underscores, e.g. max_update)"
    )


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(key: str, text: str, kind: type) -> Value:
    """`text` as a value of `kind`, or OverrideError saying what was expected."""
    value = _parsed(key, text, kind)
    if key in NOT_NEGATIVE and isinstance(value, int) and value < 0:
        raise OverrideError(f"`{key}={text}`: expected 0 or more (0: never)")
    return value


def _parsed(key: str, text: str, kind: type) -> Value:
    try:
        if kind is bool:
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(text)
        if kind is int:
            return int(text.replace("_", ""))
        if kind is float:
            return float(text)
        return text
    except ValueError:
        expected = {bool: "true/false", int: "an integer", float: "a number"}.get(kind, kind.__name__)
        raise OverrideError(f"`{key}={text}`: expected {expected}") from None


def parse_override(text: str) -> tuple[str, str]:
    """Split `key=value` (dashes in the key become underscores)."""
    key, sep, value = text.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    if not sep or not key:
        raise OverrideError(f"`{text}`: an override is key=value, e.g. max_update=300000")
    return key, value.strip()


def parse_overrides(text: str | None) -> list[str]:
    """`--set` text as a list of `key=value`: split on the commas between overrides, not on those
    inside brackets or quotes, so `adam_betas=(0.9, 0.98),lr=0.001` is two overrides."""
    overrides, current, depth, quote = [], [], 0, ""
    for char in text or "":
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            overrides.append("".join(current))
            current = []
            continue
        current.append(char)
    overrides.append("".join(current))
    return [o.strip() for o in overrides if o.strip()]


# What rank 0 writes at a checkpoint, per parameter: fp32 weights and Adam's two moments (+ the
# fp16 copy on GPUs); measured 849 MB for Transformer base's 60.1M parameters on an H100.
CHECKPOINT_BYTES_PER_PARAM = 14
# fairseq writes checkpoint_N.pt, then copies it to checkpoint_last.pt, checkpoint_best.pt and a
# checkpoint.best_loss_*.pt (keep_best_checkpoints): four files at a new best.
CHECKPOINT_COPIES = 4
SLOW_DISK_BYTES_PER_S = 100e6  # a cloud VM's standard persistent disk


# What a resume broadcasts from rank 0 beside the weights: Adam's two fp32 moments per parameter.
ADAM_STATE_BYTES_PER_PARAM = 8
FP32_BYTES = 4  # an all-reduce of the model: sync's gradients, local SGD's parameters (fp32 master)


def failure_timeout_s(options: Mapping[str, Value], vocab: int = 32000, ranks: int = 1,
                      link_mbps: float | None = None) -> int:
    """Seconds a rank may wait for a peer before it, and so the run, ends: fairseq's heartbeat and
    the process group's timeout (NCCL's watchdog ends a collective at it). It outlasts
    - the slowest checkpoint save (the other ranks wait in the next all-reduce meanwhile: 4 copies
      on a 100 MB/s disk, 1.2× for safety; Transformer big, 2.9 GB a checkpoint: 141 s);
    - on `ranks` ranks over a link measured at `link_mbps`, the largest collective, with margin
      (link_time.collective_timeout_s): an all-reduce of the whole fp32 model (every sync update, local
      SGD's every sync) and a resume's broadcast of Adam's state. Base on 16 ranks sends 454 MB a
      host per all-reduce: at 81 Mbit/s that is the old 45 s, now 90 s; at 10 Mbit/s 727 s;
    and at least the preset's heartbeat (45 s)."""
    params = preset_params(options, vocab)
    save_s = params * CHECKPOINT_BYTES_PER_PARAM * CHECKPOINT_COPIES / SLOW_DISK_BYTES_PER_S
    sync = collective_timeout_s(allreduce_bytes_per_host(params * FP32_BYTES, ranks), link_mbps)
    resume = collective_timeout_s(params * ADAM_STATE_BYTES_PER_PARAM, link_mbps) if ranks > 1 else 0
    return max(int(COMMON["heartbeat_timeout"]), math.ceil(1.2 * save_s), sync, resume)


def overridden(overrides: Iterable[str], key: str) -> bool:
    """Whether `overrides` (key=value) set `key`."""
    return any(parse_override(text)[0] == key for text in overrides)


def resolve(name: str, overrides: Iterable[str] = (), *, ranks: int = 1, link_mbps: float | None = None) -> Preset:
    """The preset `name` with `key=value` overrides applied, each type-checked. The heartbeat is
    scaled to the model, the ranks and the measured link (failure_timeout_s) unless an override
    sets it."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise OverrideError(f"unknown preset `{name}`{hint} (presets: {', '.join(PRESETS)})")
    options = dict(PRESETS[name])
    given = set()
    for text in overrides:
        key, raw = parse_override(text)
        options[key] = parse_value(key, raw, option_type(PRESETS[name], key))
        given.add(key)
    if "heartbeat_timeout" not in given:
        options["heartbeat_timeout"] = failure_timeout_s(options, ranks=ranks, link_mbps=link_mbps)
    return Preset(name, options)


def to_args(options: Mapping[str, Value]) -> list[str]:
    """fairseq command-line arguments for `options`: flags for True, nothing for False/None."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args
