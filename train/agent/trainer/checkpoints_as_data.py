"""Checkpoints load as data, never as code: every torch.load in a rank (fairseq's resume, its
generate's --path, rank 0's state broadcast to the others) unpickles weights-only.

A checkpoint reaches a host from a peer's keeper or from a bucket; the sha256 checked on the way
comes from the sender, so it proves a whole file, not an honest one. A pickle can name any function
(`os.system`) and have the load call it. torch's weights-only unpickler builds tensors, containers,
numbers and strings, and only the classes allow-listed here; anything else is refused before it is
called, and the refusal names it (UnsafeCheckpoint).

What a checkpoint of tandem's runs holds beyond tensors (saved by fairseq 0.12 under tandem's entry
point; tests/unit/train/agent/trainer/test_checkpoints_as_data.py saves one and asks torch): only
fairseq's legacy `args`, an argparse.Namespace. Also allowed: what rank 0 broadcasts with the state
(fairseq's _TensorPlaceholder), omegaconf's config nodes (fairseq versions before 0.10 kept `cfg`
as a DictConfig: a model fine-tuned from one), and numpy's scalars (a metric kept as a numpy float).
fairseq calls torch.load without `weights_only`; torch's own default is weights-only since 2.6,
but TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (which hosts provisioned before issue 54 still have in
/etc/tandem/env) turns that off: the load here passes weights_only=True itself, which the variable
cannot override.
"""

from __future__ import annotations

import pickle
import re

_MESSAGE_GLOBAL = re.compile(r"GLOBAL (\S+)")


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint that would run code (or build a class not allow-listed) when loaded."""


def allowed_globals() -> list:
    """The classes and functions a checkpoint may name besides torch's own (module docstring)."""
    import argparse
    import collections
    import typing

    import numpy as np
    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import DictConfig, ListConfig, base, nodes

    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25 pickles a scalar's dtype by its class
    numpy_scalars = [np.dtype, _numpy_scalar()] + [
        getattr(dtypes, name) for name in ("BoolDType", "Float16DType", "Float32DType", "Float64DType",
                                           "Int32DType", "Int64DType") if hasattr(dtypes, name)]
    omegaconf = [DictConfig, ListConfig, base.ContainerMetadata, base.Metadata, nodes.AnyNode,
                 typing.Any, collections.defaultdict, dict, list, int]  # the nodes, and what their pickles call
    return [argparse.Namespace, _TensorPlaceholder, *omegaconf, *numpy_scalars]


def _numpy_scalar():
    """numpy's scalar rebuilder, by its name in the installed numpy (numpy 2 moved it to _core)."""
    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import scalar
    return scalar


def refusal(source, error: Exception) -> str:
    """tandem's words for torch's refusal: which file, and what in it would have run."""
    text = str(error)
    found = _MESSAGE_GLOBAL.search(text)
    what = f"it names {found[1]}, which is not data" if found else \
        f"it holds what a weights-only load cannot build ({_last_line(text)})"
    name = getattr(source, "name", source)
    return (f"tandem: refused to load checkpoint {name}: {what}. A checkpoint from a peer or a bucket is "
            "loaded as data only (train.agent.trainer.checkpoints_as_data); nothing of it was run.")


def _last_line(text: str) -> str:
    said = [line.strip() for line in text.splitlines() if "error:" in line.lower() or "unsupported" in line.lower()]
    return (said[-1] if said else text.strip().splitlines()[-1] if text.strip() else "no detail")[:200]


def install() -> None:
    """torch.load, in this process, always weights-only with allowed_globals; a refusal raises
    UnsafeCheckpoint (an UnpicklingError, as callers expect of a bad file)."""
    import functools

    import torch

    load = torch.load
    if getattr(load, "_tandem_weights_only", False):
        return
    torch.serialization.add_safe_globals(allowed_globals())

    @functools.wraps(load)
    def weights_only_load(f, *args, **kwargs):
        kwargs["weights_only"] = True  # whatever the caller asked: no caller here needs code from a file
        try:
            return load(f, *args, **kwargs)
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpoint(refusal(f, error)) from error

    weights_only_load._tandem_weights_only = True  # type: ignore[attr-defined]
    torch.load = weights_only_load
