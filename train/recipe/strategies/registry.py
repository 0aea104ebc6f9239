"""The strategies by name: `register` (one per module, Strategy's subclasses only, duplicates refused),
`parse` (the `--comm` text once into a typed value), and `ladder` (the one order `--comm auto`, fab
predict's comparison and bench-step's auto all try them in)."""

from __future__ import annotations

from collections.abc import Mapping

from .base import CommError, Strategy

_REGISTRY: dict[str, type[Strategy]] = {}

# `--update-freq K` (gradient accumulation) is no --comm value but a rung of the ladder: sync's
# all-reduce once per K batches (train.recipe.strategies.update_freq)
UPDATE_FREQ = "update-freq"


def register(cls: type[Strategy]) -> type[Strategy]:
    """A class decorator: the strategy known by its `name`."""
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"register takes a subclass of {Strategy.__module__}.Strategy, not {cls!r}")
    if not cls.name or cls.name in _REGISTRY or cls.name in ("auto", UPDATE_FREQ):
        raise ValueError(f"a strategy needs a name of its own, not {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Every strategy's name, least invasive first (as the ladder orders them; the rest after)."""
    return sorted(_REGISTRY, key=lambda n: (_REGISTRY[n].rung is None, _REGISTRY[n].rung or 0, n))


def syntax() -> str:
    """The --comm values, as an error message or a help text says them."""
    return ", ".join(n + (f"[:{_REGISTRY[n].argument}]" if _REGISTRY[n].argument else "") for n in names())


def get(name: str) -> type[Strategy]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise CommError(f"--comm is {syntax()} or auto, not {name!r}") from None


def parse(text: str | None) -> Strategy:
    """`sync`, `fp16`, `local-sgd` (its default H), `local-sgd:32`, ...; `auto` is not a strategy: it picks one."""
    text = (text or "sync").strip().lower()
    name, _, argument = text.partition(":")
    return get(name).from_argument(argument)


def overlapping() -> list[str]:
    """The strategies whose all-reduce can hide behind the backward pass (an overlap is measured for each)."""
    return [n for n in names() if _REGISTRY[n].overlaps]


def options() -> dict[str, type]:
    """Every strategy's own --set options, with their types."""
    return {k: t for cls in _REGISTRY.values() for k, t in cls.options.items()}


def tandem_options() -> set[str]:
    """The strategies' options tandem reads itself and never passes to fairseq."""
    return {k for cls in _REGISTRY.values() for k in cls.tandem_options}


def fairseq_options_of(strategy: Strategy) -> tuple[set[str], set[str]]:
    """(options to pass to fairseq, options to drop) of the strategies' own, for a run with `strategy`:
    another strategy's options would not parse (fairseq knows --block-momentum only under --use-bmuf)."""
    own = set(type(strategy).options) - tandem_options()
    return own, set(options()) - own


def starts(options: Mapping[str, object]) -> dict[str, int]:
    """Each strategy's synchronous start (updates all-reduced as sync does first) for a run's options."""
    return {n: cls().sync_updates(options) for n, cls in _REGISTRY.items() if cls.starts_synchronous}


def ladder(precision: str = "fp32", params: int | None = None) -> list[Strategy | str]:
    """What `--comm auto` tries, least invasive first: each registered strategy with a rung (as it
    would try it for this model at this precision) and UPDATE_FREQ between them where its rung says."""
    from . import update_freq

    rungs: list[tuple[float, Strategy | str]] = [(update_freq.RUNG, UPDATE_FREQ)]
    for cls in _REGISTRY.values():
        if cls.rung is not None and (value := cls.for_auto(precision, params)) is not None:
            rungs.append((cls.rung, value))
    return [value for _, value in sorted(rungs, key=lambda r: r[0])]
