"""`--update-freq K`, gradient accumulation: no --comm value but a rung of `--comm auto`'s ladder.
K micro-batches per update and one all-reduce: K× fewer all-reduces per sample, a K× larger
effective batch (the learning rate and its warm-up may need retuning)."""

RUNG = 2.0  # after fp16 compression, before the strategies that change what is exchanged
CAVEAT = "batch per update {factor}x the run's: lr/warmup may need retuning"


def parse(text: str) -> int | None:
    """K of `update-freq:K` (bench-quality's entries), None for another text; ValueError for a bad K."""
    name, _, k = text.strip().lower().partition(":")
    if name != "update-freq":
        return None
    if not k.isdigit() or int(k) < 2:
        raise ValueError(f"--comm update-freq:K takes a whole number of batches per update, 2 or more, not {text!r}")
    return int(k)
