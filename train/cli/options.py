"""Every fab option's value checked before anything reaches a host.

A parser per kind of value turns the text Invoke hands a task (tandem's tasks take every value as
text: train.cli.executor.TandemTask) into what the task passes on, or raises with what it accepts; a check
looks at several options, or at them and the hosts, at once. train.cli.executor.cluster_task runs them all
first and says a failure in one line, exit 2 (train.errors):

    error: --update-freq: expected a whole number >= 1, got 'x'

The parsers reuse tandem's own where one exists (--comm, --set, --backup, tc rates, buffer sizes).
An option several tasks share is one `Option` here, its help beside its parser (PRESET, COMM, ...):
a task that names it among cluster_task's parsers gets both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import hostvars
from ..agent.measure.allreduce import parse_size
from ..agent.offsite import target
from ..cluster import CLUSTER_GROUP, Host
from ..errors import BadInventory, OptionError
from ..plan.link import rate_bits
from ..reachability import require_answering
from ..recipe import presets, strategies
from ..recipe.record import REPORTS
from ..run.checkpoints import BackupPolicy

Parser = Callable[[object], object]
Values = Mapping[str, object]

PRECISIONS = ("fp32", "fp16", "bf16")
# a name that becomes a directory on every host and goes into shell commands (datasets, runs)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CHECKPOINT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.pt")


class Expected(ValueError):
    """A value that is not what a parser takes: `expected <what>, got <value>`."""

    def __init__(self, what: str, got: object):
        super().__init__(f"expected {what}, got {got!r}")


def whole(minimum: int = 1, maximum: int | None = None) -> Parser:
    """A whole number in [minimum, maximum]."""
    what = f"a whole number >= {minimum}" if maximum is None else f"a whole number from {minimum} to {maximum}"

    def parse(value: object) -> int:
        text = str(value).strip()
        if isinstance(value, bool) or not re.fullmatch(r"[+-]?\d+", text):
            raise Expected(what, value)
        n = int(text)
        if n < minimum or (maximum is not None and n > maximum):
            raise Expected(what, value)
        return n

    return parse


def number(above: float = 0.0, at_most: float | None = None, unit: str = "") -> Parser:
    """A number greater than `above` (and at most `at_most`)."""
    what = f"a number{unit} > {above:g}" + (f" and <= {at_most:g}" if at_most is not None else "")

    def parse(value: object) -> float:
        try:
            x = float(str(value).strip())
        except ValueError:
            raise Expected(what, value) from None
        if isinstance(value, bool) or x != x or x <= above or (at_most is not None and x > at_most):
            raise Expected(what, value)  # x != x: nan
        return x

    return parse


port = whole(1, 65535)
# the run's ports, PORT..PORT+3 (rendezvous) and PORT+100..PORT+102 (keepers, etcd), inside what the hosts'
# firewall lets peers reach (roles/network: network_firewall_ports 29500-29510, 29600-29612); outside,
# the hosts could not meet, or the firewall would have to be opened wider than the run needs
guarded_port = whole(29500, 29507)
seconds = number(unit=" of seconds")
mbps = number(unit=" of Mbit/s")


def fraction(value: object) -> float:
    """0 to 1, both included (an overlap, a share of the link)."""
    try:
        x = float(str(value).strip())
    except ValueError:
        raise Expected("a fraction from 0 to 1, e.g. 0.85", value) from None
    if not 0 <= x <= 1:
        raise Expected("a fraction from 0 to 1, e.g. 0.85", value)
    return x


def choice(*choices: str) -> Parser:
    def parse(value: object) -> str:
        if str(value) not in choices:
            raise Expected(f"one of {', '.join(choices)}", value)
        return str(value)

    return parse


precision = choice(*PRECISIONS)
preset = choice(*presets.PRESETS)


def name(value: object) -> str:
    """A dataset's or a run's name: a directory on every host, written into shell commands."""
    if not NAME.fullmatch(str(value)):
        raise Expected("a name of letters, digits, '.', '_' and '-' (it names a directory on every host)", value)
    return str(value)


def replacement(value: object) -> str:
    """`--replace OLD=NEW`: a host of the run, and the inventory's host that takes its place."""
    old, sep, new = str(value).partition("=")
    if not sep or not NAME.fullmatch(old) or not NAME.fullmatch(new) or old == new:
        raise Expected("OLD=NEW: the run's host a new VM replaces, and the new VM's inventory name", value)
    return f"{old}={new}"


def existing_run(value: object) -> str:
    """The id of a run this controller started (reports/<id>/run.json)."""
    run_id = name(value)
    if not (REPORTS / run_id / "run.json").exists():
        runs = [p for p in REPORTS.glob("*/run.json") if not p.parent.is_symlink()]  # not `latest`
        newest = sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)
        known = ", ".join(p.parent.name for p in newest[:3]) + (", ..." if len(newest) > 3 else "")
        raise Expected(f"a run of this controller ({known or 'none yet'})", value)
    return run_id


def checkpoint(value: object) -> str:
    if not CHECKPOINT.fullmatch(str(value)):
        raise Expected("a checkpoint file name such as checkpoint_best.pt or checkpoint_last.pt", value)
    return str(value)


def directory(value: object) -> str:
    if not Path(str(value)).expanduser().is_dir():
        raise Expected("a directory on this machine", value)
    return str(value)


def overrides(value: object) -> list[str]:
    """--set's `key=value,...`, each written as one (the preset types them: overrides_fit_preset)."""
    found = presets.parse_overrides(str(value)) if value is not None else []
    for text in found:
        presets.parse_override(text)  # raises naming the one that is no key=value
    return found


def overrides_text(value: object) -> str:
    """--set as the text a benchmark reads, each override written as one."""
    overrides(value)
    return str(value)


def comm(value: object) -> str:
    """One strategy, or auto."""
    text = str(value).strip().lower()
    return text if text == "auto" else str(strategies.parse(text))


def each_of(value: object, check, expected: str) -> str:
    """A comma-separated list, at least one item, each item passing `check`: the text."""
    items = [x.strip() for x in str(value).split(",") if x.strip()]
    if not items:
        raise Expected(expected, value)
    for item in items:
        check(item)
    return str(value)


def comm_list(value: object) -> str:
    """Strategies, comma-separated, auto among them: the text, each checked."""
    return each_of(value, comm, f"strategies, comma-separated: {strategies.syntax()} or auto")


def backup(value: object) -> str:
    BackupPolicy.parse(str(value))
    return str(value)


def checkpoints_to(value: object) -> str:
    """Where the hosts copy checkpoints off the cluster (train.agent.offsite.target), or off. Its error
    never repeats a secret the URL held."""
    text = str(value).strip()
    return text if text.lower() in ("off", "none") else target.parse(text).url


minutes = number(unit=" of minutes")


def rates(value: object) -> str:
    """tc rates, comma-separated: the text, each checked."""
    return each_of(value, rate_bits, "tc rates, comma-separated, e.g. 10mbit,100mbit,1gbit,none")


def size(value: object) -> str:
    """A buffer size as all_reduce takes it (1M, 64M, 1G): the text, checked."""
    try:
        if parse_size(str(value)) >= 1:
            return str(value)
    except ValueError:
        pass
    raise Expected("a size like 1M, 64M or 1G (K, M, G: binary units)", value)


def link(value: object) -> str:
    """Where predict takes the link's speed from: measure, bench, or Mbit/s."""
    text = str(value).strip().lower()
    if text in ("measure", "bench"):
        return text
    try:
        mbps(text)
    except ValueError:
        raise Expected("measure, bench or a speed in Mbit/s", value) from None
    return text


# ---- the options several tasks share: each declared once, its help (fab --help TASK) with its parser ----


@dataclass(frozen=True)
class Option:
    """An option several tasks take. Named among a task's cluster_task parsers (train.cli.executor), it gives
    the task its parser and its help; the task's own help= may say more (`PRESET.help + "; ..."`)."""

    name: str  # the task's parameter it is (--name, `_` written `-`)
    help: str
    parse: Parser


_STRATEGIES = strategies.syntax().replace("[:H]", ":H").replace("[:R]", ":R")

PRESET = Option("preset", "the model: tiny (default; lab, CPU), transformer_wmt_en_de (base), "
                          "transformer_vaswani_wmt_en_de_big", preset)
SET = Option("set", "fairseq option overrides, comma-separated: --set max_update=300000,lr=0.001", overrides)
SET_TEXT = replace(SET, parse=overrides_text)  # the benchmarks pass --set on as text
DATASET = Option("dataset", "dataset on /data/tandem/datasets (default synthetic)", name)
PRECISION = Option("precision", "fp32, fp16 or bf16 (the last two on GPU hosts): what the ranks train and "
                                "all-reduce in; default fp16 on GPU hosts, fp32 on CPU hosts", precision)
PORT = Option("port", "rendezvous port on the first host, 29500 to 29507 (default 29500): the run's generations "
                      "take turns on PORT..PORT+3 and its keepers and etcd use PORT+100..PORT+102, all inside the "
                      "ports the hosts' firewall opens to peers only (network_firewall_ports: 29500-29510, "
                      "29600-29612)",
              guarded_port)
COMM = Option("comm", f"how ranks share updates: {_STRATEGIES} (train/recipe/strategies: one module each), or "
                      "auto (the least invasive that reaches 90% on the measured link; see fab predict)", comm)
COMM_LIST = Option("comm", f"communication strategies, comma-separated, one training job each: {_STRATEGIES}",
                   comm_list)


# ---- checks of several options at once, or of options and hosts: check(hosts, values) ----


def hosts_described(hosts: Sequence[Host], values: Values) -> None:
    """fab train: every host is one of the inventory's `cluster` group (the cluster, in rank order) and says
    its GPUs (`gpus: 0`: a CPU host). Unsaid, a GPU VM reads as a CPU host: gloo, fp32, one rank."""
    outside = [h.name for h in hosts if CLUSTER_GROUP not in hostvars.groups(h)]
    if outside:
        raise BadInventory(f"{', '.join(outside)}: not in the inventory's `{CLUSTER_GROUP}` group: list the hosts "
                           f"that train under all.children.{CLUSTER_GROUP}.hosts, rank 0's first (as fab init writes)")
    unsaid = [h.name for h in hosts if not hostvars.given(h, "gpus")]
    if unsaid:
        raise BadInventory(f"{', '.join(unsaid)}: the inventory gives no `gpus`: set how many GPUs "
                           f"{'each VM has' if len(unsaid) > 1 else 'the VM has'} (gpus: 0 for a CPU host); "
                           "`fab init --check` shows what each host has")


def precision_fits_hosts(hosts: Sequence[Host], values: Values) -> None:
    """fp16 and bf16 train on GPUs: every host must have one."""
    chosen = values.get("precision")
    cpu_only = [h.name for h in hosts if h.gpus == 0]
    if chosen not in (None, "fp32") and cpu_only:
        raise OptionError("precision", f"{chosen} needs GPUs; {', '.join(cpu_only)} "
                                       f"{'has' if len(cpu_only) == 1 else 'have'} none (gpus: 0): use fp32")


def overrides_fit_preset(hosts: Sequence[Host], values: Values) -> None:
    """--set's options are the preset's, with values of their types."""
    given = values.get("set") or []
    try:
        presets.resolve(str(values["preset"]), overrides(given) if isinstance(given, str) else given)
    except presets.OverrideError as err:
        raise OptionError("set", err) from None


def hosts_answer(hosts: Sequence[Host], values: Values) -> None:
    """The task's hosts answer SSH, each asked once before the task's own work (train.reachability): a silent
    host is said as unreachable, never as the file, driver, NIC or root the task would have found missing.
    The last of a task's checks: bad input is said before any host is reached."""
    require_answering(hosts)


def one_corpus(hosts: Sequence[Host], values: Values) -> None:
    if values.get("source") and values.get("wmt16"):
        raise OptionError("source", "--source and --wmt16 name two corpora: give one")


def sizes_in_order(hosts: Sequence[Host], values: Values) -> None:
    smallest, largest = values.get("min_size"), values.get("max_size")
    if smallest and largest and parse_size(str(smallest)) > parse_size(str(largest)):
        raise OptionError("min_size", f"expected a size <= --max-size {largest}, got {smallest!r}")


def resumable_run(hosts: Sequence[Host], values: Values) -> None:
    """fab train: --run names a run to resume unless --new starts one by that name; --rejoin grows
    the run back, so it cannot start a new one."""
    if values.get("rejoin") and values.get("new"):
        raise OptionError("rejoin", "--rejoin takes lost hosts back into a run; --new starts another: give one")
    if values.get("run") and not values.get("new") and not values.get("resume_from"):  # moved: from its copy
        try:
            existing_run(values["run"])
        except Expected as err:
            raise OptionError("run", f"{err} (--new starts a run by that name)") from None
