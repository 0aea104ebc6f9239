"""What every fab task shares: the hosts it acts on, all of them in one call.

Fabric's own executor turns `fab --hosts v100a,v100b TASK` into one call of TASK per host,
serially, each with a Connection. A cluster job must act on all of them together (one
rendezvous, ranks in host order), so tandem's fabric.yaml names `ClusterExecutor` as the
executor (`tasks.executor_class`, Invoke's supported way to change it): it reads the same
`--hosts` value Fabric's executor reads, hands the names to the task through the config
(`cluster_hosts`) and calls the task once. `cluster_task` resolves them through the inventory,
checks every option first (train.cli.options) and ends the task with its exit status (train.errors).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys

import fabric
from fabric import Connection
from fabric.executor import Executor
from invoke.exceptions import ParseError
from rich.console import Console
from rich.text import Text

from ..cluster import UNREACHABLE, ClusterError, Host, select
from ..errors import BAD_INPUT, DONE, FAILED, REFUSED, OptionError, Refused
from ..onboard import inventory
from .options import Option

console = Console(highlight=False, soft_wrap=True)
errors = Console(stderr=True, highlight=False, soft_wrap=True)  # bad input: one line on stderr


# The only short flags: each means the same in every task that has the option (`fab logs -f`, as tail -f).
# Before the task's name `-f` stays Fabric's own --config.
SHORT_FLAGS = {"follow": "f"}

INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell says it (docs/cli.md)


class TandemTask(fabric.tasks.Task):
    """Fabric's task, its options long only (but SHORT_FLAGS) and their values text. Invoke derives
    short flags from each task's own option names (`-c` was --comm in one task, --checkpoint in
    another), and converts a value to its default's type while parsing, where a bad one ends in a
    traceback; the task's parsers (train.cli.options) convert it instead, and say what they accept."""

    def __init__(self, body, **kwargs):
        shared = getattr(body, "shared_help", {})  # its shared options' (cluster_task), before its own
        super().__init__(body, **{**kwargs, "help": {**shared, **(kwargs.get("help") or {})},
                                  "auto_shortflags": False})

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        if opts.get("kind") in (int, float):
            opts["kind"] = str
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def task(*args, **kwargs):
    """`@task` for tandem's fabfile: fabric's, with TandemTask."""
    return fabric.task(*args, **{"klass": TandemTask, **kwargs})


def ends_as_documented(program) -> None:
    """fab's own endings, as every task's (docs/cli.md): Invoke's parser refuses an unknown option or a flag
    without its value with exit 1, tandem says 2 for every bad input (train.errors); Ctrl-C ends Invoke's
    program with exit 1 and no word, tandem says `interrupted` and exits 130 (128 + SIGINT, as a shell
    says it); a reader that closed the pipe (`fab -l | head -1`) ends it quietly, exit 0, never with
    a BrokenPipeError's traceback. The fabfile is loaded before the tasks' options are parsed, and Invoke
    has no setting for either, so the running program's later steps are wrapped from there."""
    if getattr(program.parse_tasks, "tandem_endings", False):
        return
    parse = program.parse_tasks

    def parse_tasks():
        try:
            parse()
        except ParseError as err:  # Invoke names an option `<Argument: update_freq>`: as the user typed it
            said = re.sub(r"<Argument: (\w+)[^>]*>", lambda m: "--" + m[1].replace("_", "-"), str(err))
            say_error(f"{said} (fab -l lists the tasks, fab --help TASK a task's options)")
            sys.exit(BAD_INPUT)

    program.parse_tasks = parse_tasks
    for step in ("parse_tasks", "parse_cleanup", "update_config", "execute"):  # -l and --help print in parse_cleanup
        setattr(program, step, _ending_as_documented(getattr(program, step)))
    program.parse_tasks.tandem_endings = True


def _ending_as_documented(step):
    @functools.wraps(step)
    def wrapper():
        try:
            step()
        except KeyboardInterrupt:
            if not _closed_output():
                errors.print("interrupted", markup=False)
            sys.exit(INTERRUPTED)
        except BrokenPipeError:
            if not _closed_output():  # a pipe to a host, not the user's reader: a fault as any other
                raise
            sys.exit(DONE)

    return wrapper


def _closed_output() -> bool:
    """Whether stdout or stderr is a pipe whose reader went away; each such one then writes to /dev/null,
    so that Python's last flush at exit finds no pipe to break."""
    import select  # not train.cluster's

    closed = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            poll = select.poll()
            poll.register(fd, select.POLLOUT)
            broken = any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
        except (AttributeError, ValueError, OSError):
            continue
        if broken:
            closed = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return closed


def say_error(message: object, out: Console = errors, label: str = "error:") -> None:
    """`error: ...` as one line, the message printed as it is (never read as rich markup)."""
    out.print(Text.assemble((label, "red"), " ", str(message)))


class ClusterExecutor(Executor):
    """Every task once, for all the hosts given with `--hosts` (in that order), not once per host."""

    def expand_calls(self, calls, apply_hosts=True):
        value = self.core[0].args.hosts.value if self.core else None
        self.config.cluster_hosts = [h.strip() for h in (value or "").split(",") if h.strip()] or None
        return super().expand_calls(calls, apply_hosts=False)


def cluster_hosts(c) -> list[Host]:
    """The inventory's hosts (`FABRIC_INVENTORY`, else fabric.yaml's `inventory`), those named with
    --hosts when given; a name the inventory lacks, or given twice, is bad input."""
    hosts, names = inventory_hosts(c), c.config.get("cluster_hosts") or []
    unknown = [n for n in names if n not in {h.name for h in hosts}]
    if unknown:
        raise OptionError("hosts", f"unknown host {', '.join(unknown)}: the inventory has "
                                   f"{', '.join(h.name for h in hosts)}")
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise OptionError("hosts", f"{', '.join(twice)} given twice: each host runs once")
    return select(hosts, names)


def cluster_task(body=None, /, *, checks=(), **parsers):
    """Run the task body once for all selected hosts, its options checked first: each named in
    `parsers` converted by its parser (train.cli.options), then every check(hosts, values) of `checks`;
    a parser that is a shared option (train.cli.options.Option) gives the task its help too (TandemTask).
    Ends the task with its exit status (train.errors): 2 for bad input, before any host is reached,
    3 for a refusal an --accept-... option overrides, 1 for any other ClusterError, and 1 for a host
    its SSH connection could not reach (train.cluster.HostConnection), in one line with the fix."""
    if body is None:
        return functools.partial(cluster_task, checks=checks, **parsers)
    signature = inspect.signature(body)
    params = list(signature.parameters.values())
    if unknown := set(parsers) - set(signature.parameters):
        raise TypeError(f"{body.__name__} has no option {', '.join(sorted(unknown))} to parse")
    shared = {key: p for key, p in parsers.items() if isinstance(p, Option)}
    if misplaced := [f"--{key} given --{p.name}'s" for key, p in shared.items() if p.name != key]:
        raise TypeError(f"{body.__name__}: {', '.join(misplaced)}: a shared option parses its own name only")
    parsers = {key: p.parse if isinstance(p, Option) else p for key, p in parsers.items()}

    @functools.wraps(body)
    def wrapper(c, *args, **kwargs):
        if isinstance(c, Connection):  # Fabric's own executor: one call per host
            say_error("fab expanded --hosts into one call per host: tandem's fabric.yaml sets "
                      "tasks.executor_class: train.cli.executor.ClusterExecutor; run fab from the checkout")
            sys.exit(BAD_INPUT)
        values: dict = {}
        try:
            bound = signature.bind(c, None, *args, **kwargs)
            bound.apply_defaults()
            values = {k: v for k, v in bound.arguments.items() if k not in (params[0].name, params[1].name)}
            values = parsed(values, parsers)
            hosts = cluster_hosts(c)
            for check in checks:
                check(hosts, values)
            return body(c, hosts, **values)
        except OptionError as err:
            say_error(err)
            sys.exit(BAD_INPUT)
        except Refused as err:
            say_error(err, errors if values.get("json") else console, "refused:")
            sys.exit(REFUSED)
        except ClusterError as err:
            say_error(err, errors if values.get("json") else console)  # --json keeps stdout for the JSON
            sys.exit(FAILED)
        except UNREACHABLE as err:
            if getattr(err, "tandem_host", None) is None:  # not an SSH connection tandem opened: as it is
                raise
            from ..reachability import explain  # the fix for each way SSH fails, as `fab init` says it

            say_error(explain(err.tandem_host, err), errors if values.get("json") else console)
            sys.exit(FAILED)

    # Fabric reads the task's options from its signature: hide the `hosts` we pass in.
    wrapper.__signature__ = signature.replace(parameters=[params[0], *params[2:]])
    wrapper.shared_help = {key: p.help for key, p in shared.items()}
    return wrapper


def parsed(values: dict, parsers: dict) -> dict:
    """The options' values, each given one converted by its parser; whatever a parser raises about
    its value (a ValueError, a ClusterError) is an OptionError naming the option."""
    out = dict(values)
    for option, parse in parsers.items():
        if out[option] is None:  # not given, and no default to check
            continue
        try:
            out[option] = parse(out[option])
        except (ValueError, ClusterError) as err:
            raise OptionError(option, err) from None
    return out


def known_hosts(c) -> list[Host]:
    """Every host of the inventory, whatever --hosts picked (a host a run lost can come back from there)."""
    return inventory_hosts(c)


def inventory_hosts(c) -> list[Host]:
    """The inventory's hosts (train.onboard.inventory), which inventory said once on stderr when the user did
    not name it with FABRIC_INVENTORY."""
    return inventory.load(c.config.get("inventory"), lambda note: errors.print(note, markup=False))
