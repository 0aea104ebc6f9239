"""What a checkpoint holds, read on the host that has it, without torch and without reading its tensors.

    python -m train.agent.trainer.checkpoint_info /data/tandem/runs/RUN/checkpoints/checkpoint_last.pt

Prints one JSON line: {"path", "update", "epoch", "iterations_in_epoch", "bytes", "mtime"}, with
"update": null and "error" when there is no readable checkpoint. A torch checkpoint is a zip whose
`data.pkl` holds everything but the tensors' bytes: only that entry (KBs of a GB file) is read,
each tensor a stand-in. fairseq rewrites checkpoint_last.pt in place (a copy of the file it just
saved): a file caught half-written is no zip yet, or changes size while read; it is read again, up
to `--tries` times, so the answer is a whole file's or an error, never a torn one's.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import zipfile
from pathlib import Path


class _Anything:
    """Whatever class or function the pickle names (torch's tensor rebuilders, fairseq's meters):
    takes any arguments and state, holds nothing we need."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()


_REAL = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "dict"),
         ("builtins", "list"), ("builtins", "tuple")}


class _SkeletonUnpickler(pickle.Unpickler):
    """The checkpoint's dicts and numbers as they are; classes and tensors as stand-ins (nothing
    of the file is run: no class it names is imported)."""

    def find_class(self, module: str, name: str):
        if (module, name) in _REAL:
            return super().find_class(module, name)
        return type(name, (_Anything,), {})

    def persistent_load(self, pid):
        return None  # a tensor's storage: its bytes are another entry of the zip, never read


def skeleton(path: Path) -> dict:
    """The checkpoint's top-level dict with every tensor a stand-in. zipfile.BadZipFile where the
    file is not (yet) a whole torch zip."""
    with zipfile.ZipFile(path) as archive:
        pickled = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
        with archive.open(pickled) as f:
            state = _SkeletonUnpickler(f).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a fairseq checkpoint (a {type(state).__name__}, not a dict)")
    return state


def progress(state: dict) -> dict:
    """The update count, epoch and place in the epoch a fairseq checkpoint resumes from. ValueError
    where a field is not what fairseq writes (a stand-in where a dict or a number belongs: a file
    from a peer or a bucket is read as untrusted)."""
    history = state.get("optimizer_history") or [{}]
    last = history[-1] if isinstance(history, list) and isinstance(history[-1], dict) else {}
    iterator = _dict(_dict(state.get("extra_state")).get("train_iterator"))
    update, epoch, place = last.get("num_updates", 0) or 0, iterator.get("epoch"), iterator.get("iterations_in_epoch")
    if not all(isinstance(n, int | None) for n in (update, epoch, place)):
        raise ValueError("not a fairseq checkpoint (its update or epoch is no number)")
    return {"update": update, "epoch": epoch, "iterations_in_epoch": place}


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def read(path: Path, tries: int = 5, pause_s: float = 1.0) -> dict:
    """`path`'s progress, size and mtime, read while the file held still; an "error" when it is
    missing, or was never whole in `tries` reads."""
    error = "missing"
    for attempt in range(tries):
        try:
            before = os.stat(path)
        except FileNotFoundError:
            return {"path": str(path), "update": None, "error": "missing"}
        try:
            said = progress(skeleton(path))
            after = os.stat(path)
            if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns):
                return {"path": str(path), **said, "bytes": after.st_size, "mtime": after.st_mtime}
            error = "rewritten while read"
        except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError, OSError) as err:
            error = f"{type(err).__name__}: {err}"
        if attempt + 1 < tries:
            time.sleep(pause_s)
    return {"path": str(path), "update": None, "error": error}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.trainer.checkpoint_info",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path)
    p.add_argument("--tries", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(read(args.path, args.tries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
