"""A run's length in words, for `fab train`'s start line: tokens per update, updates, total tokens and
epochs of the dataset.

    >>> length_phrase(458752, 24000, 140_000_000, "wmt16")
    '458,752 tokens per update x 24,000 updates = 11.0 B tokens ≈ 79 epochs of wmt16 (140.0 M tokens)'

Tokens are fairseq's max_tokens units (a batch's sentences x its longest one, padding included). The
dataset's tokens are those of the longer side of its training set, end-of-sentence marks included,
read from the prepared binaries (train.en-de.{en,de}.bin; fairseq stores a token in 2 bytes for a
dictionary of fewer than 65,500 symbols, else 4). A pair's longer side is not always the same
language (on the WMT16 sample, the sum of each pair's longer side is 8% over the longer language's
total) and batches are not quite full, so the epochs are an estimate, ~10% high.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..cluster import Host, HostResult, run_all

SPECIALS = 4  # fairseq's <s>, <pad>, </s>, <unk>: in the dictionary, not in dict.en.txt
UINT16_SYMBOLS = 65500  # fairseq's best_fitting_int_dtype: uint16 below it


def count_text(n: float) -> str:
    """`11.0 B`, `137.6 M`, `52.4 k`, `512`: the start line's large counts."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f}"


def length_phrase(tokens_per_update: int | None, updates: int | None, dataset_tokens: int | None,
                  dataset: str, unread: str = "not read from the hosts") -> str:
    """The run's length: tokens per update x updates = total tokens ≈ epochs of `dataset`."""
    if not tokens_per_update:
        return f"{updates:,} updates" if updates else "no max_update"
    head = f"{tokens_per_update:,} tokens per update"
    if not updates:
        return f"{head}, no max_update (fairseq stops at max_epoch)"
    total = tokens_per_update * updates
    head = f"{head} x {updates:,} updates = {count_text(total)} tokens"
    if not dataset_tokens:
        return f"{head} (epochs of {dataset}: its size unknown, {unread})"
    epochs = total / dataset_tokens
    shown = f"{epochs:.0f}" if epochs >= 10 else f"{epochs:.2g}"
    return f"{head} ≈ {shown} epochs of {dataset} ({count_text(dataset_tokens)} tokens)"


def dataset_tokens(bin_bytes: Sequence[int], dict_lines: int) -> int | None:
    """The training set's tokens (the longer side) from its binaries' sizes and dict.en.txt's lines."""
    if not bin_bytes or dict_lines <= 0:
        return None
    itemsize = 2 if dict_lines + SPECIALS < UINT16_SYMBOLS else 4
    return max(bin_bytes) // itemsize


def read_dataset_tokens(host: Host, data_dir: str, langs: tuple[str, str] = ("en", "de")) -> tuple[int | None, str]:
    """`dataset_tokens` of the prepared data on `host`, or None and why not (said on the start line:
    a failed read never fails a start, but the user should see where and why the epochs are missing)."""
    pair = "-".join(langs)
    files = " ".join(shlex.quote(f"{data_dir}/train.{pair}.{lang}.bin") for lang in langs)
    command = f"stat -c %s {files} && wc -l < {shlex.quote(f'{data_dir}/dict.{langs[0]}.txt')}"
    return tokens_of_answer(run_all([host], command, timeout=15)[host.name], host, len(langs))


def tokens_of_probe(answer: dict, host: Host) -> tuple[int | None, str] | None:
    """read_dataset_tokens from what preflight's probe of `host` already said (train.agent.measure.probe's
    training_files): no round trip of its own. None where the probe did not say (an older agent)."""
    files = answer.get("training_files")
    if not isinstance(files, dict):
        return None
    if "error" in files:
        return None, f"not read on {host.name}: {files['error']}"
    tokens = dataset_tokens(files.get("bin_bytes") or [], int(files.get("dict_lines") or 0))
    return (tokens, "") if tokens else (None, f"not read on {host.name}: an empty dictionary")


def tokens_of_answer(result: HostResult, host: Host, n_langs: int = 2) -> tuple[int | None, str]:
    """read_dataset_tokens from the host's answer: (tokens, "") or (None, `not read on HOST: why`)."""
    if not result.ok:
        return None, f"not read on {host.name}: {result.why}"
    words = result.stdout.split()
    if len(words) != n_langs + 1 or not all(w.isdigit() for w in words):
        return None, f"not read on {host.name}: odd answer {result.stdout.strip()[-200:]!r}"
    tokens = dataset_tokens([int(w) for w in words[:-1]], int(words[-1]))
    return (tokens, "") if tokens else (None, f"not read on {host.name}: an empty dictionary")

