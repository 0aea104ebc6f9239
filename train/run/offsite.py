"""The controller's side of checkpoint copies off the cluster (`fab train --checkpoints-to URL`): the
target checked from every host before a start, what the keepers are told, what `fab status` says.

The hosts upload (train.agent.offsite.schedule, with their own credentials): the controller carries only
the URL, which holds no secret (train.agent.offsite.target refuses one).
"""

from __future__ import annotations

import contextlib
import json
import time

from ..agent.offsite.target import BadTarget, parse
from ..cluster import Host, run_each
from ..errors import OptionError, Refused
from ..hosts.remote import agent_command
from ..recipe.record import Run
from . import launch

DEFAULT_EVERY_MIN = 30.0  # checkpoint_last off the cluster at most this often (checkpoint_best: when it changes)
CHECK_TIMEOUT_S = 90  # a store that does not answer: botocore's retries end within this
OFF = ("off", "none")


def target_of(url: str):
    """--checkpoints-to's value parsed (exit 2 naming why, a secret in it included)."""
    try:
        return parse(url)
    except BadTarget as err:
        raise OptionError("checkpoints_to", err) from None


def store_url(url: str) -> str:
    """--resume-from's value: a store URL parsed as --checkpoints-to's is (exit 2 naming why, never
    repeating a secret it held). fab train's parser, and moved.adopt's first step."""
    try:
        return parse(str(url)).url
    except BadTarget as err:
        raise OptionError("resume_from", err) from None


def choose(run: Run, url: str | None, every_min: float | None) -> None:
    """The run's target and interval: the asked ones, else a resumed run's own (`off` drops it)."""
    if url is not None:
        run.checkpoints_to = None if url.strip().lower() in OFF else target_of(url).url
    if every_min is not None:
        if not run.checkpoints_to:
            raise OptionError("checkpoints_every", "copies checkpoints off the cluster: give --checkpoints-to URL too")
        run.checkpoints_every_min = float(every_min)


def told(run: Run) -> dict | None:
    """The keepers' spec entry (train.agent.offsite.schedule), or None when no copy leaves the cluster."""
    if not run.checkpoints_to:
        return None
    return {"url": run.checkpoints_to, "every_s": round(60 * (run.checkpoints_every_min or DEFAULT_EVERY_MIN))}


def problems(answers, url: str) -> list[str]:
    """`host: what failed and the fix` for each host whose check (python -m train.agent.offsite.upload check) failed."""
    out = []
    for name, result in answers.items():
        if not result.reachable:
            out.append(f"{name}: unreachable, the target could not be checked from it ({result.error})")
            continue
        try:
            said = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            said = {"error": f"the check did not answer ({result.why}): re-run provision.yml (--tags train_env)"}
        if not said.get("ok"):
            error = said.get("error") or result.why
            out.append(f"{name}: {error}" if error.startswith(url) else f"{name}: {url}: {error}")
    return out


# how long each cloud's notice leaves before the VM goes (train.agent.keeper.preemption watches them)
NOTICE_WINDOWS_S = {"AWS spot's 2-min interruption notice": 120, "GCP's 30-s preemption notice": 30,
                    "Azure's Preempt event (30 s at least)": 30}


def copy_time_line(rates: dict[str, float], checkpoint_bytes: float, every_min: float) -> str | None:
    """What the check's probe says of a checkpoint's copy: its time at the slowest host's speed, and which
    clouds' notices leave room for the save made at one (a copy that cannot make it leaves the newest
    copy up to --checkpoints-every old)."""
    if not rates or not checkpoint_bytes:
        return None
    host, mb_s = min(rates.items(), key=lambda kv: kv[1])
    seconds = checkpoint_bytes / 1e6 / max(mb_s, 1e-3)
    short = [name for name, window in NOTICE_WINDOWS_S.items() if seconds > window]
    line = (f"a probe copy went up at {mb_s:g} MB/s from the slowest host ({host}): one checkpoint "
            f"({checkpoint_bytes / 1e9:.2f} GB) takes ~{seconds:.0f} s off the cluster")
    if short:
        line += (f"; too long for {', '.join(short)}: there the save made at the notice does not make it, and the "
                 f"newest copy may be up to {every_min:g} min old")
    return line


def check(run: Run, hosts: list[Host]) -> dict[str, float]:
    """The upload's own path end to end (a probe copy made, listed, fetched back and deleted: upload.py
    check) from every host, with each host's credentials; {host: its write speed in MB/s}. Refused (exit
    3) naming each host that cannot, what failed and the fix."""
    url = run.checkpoints_to
    commands = {h.name: agent_command(h, "offsite.upload", "check", url, "--host", h.name) for h in hosts}
    answers = run_each(hosts, commands, timeout=CHECK_TIMEOUT_S)
    if failed := problems(answers, url):
        raise Refused(f"checkpoint copies cannot go to {url} from every host, nothing started:\n  "
                      + "\n  ".join(failed) + "\nfix it, or start without --checkpoints-to (--checkpoints-to off "
                      "for a run that had one)")
    rates = {}
    for name, result in answers.items():
        with contextlib.suppress(ValueError, IndexError, KeyError, TypeError):
            rates[name] = float(json.loads(result.stdout.strip().splitlines()[-1])["mb_s"])
    return rates


def start_line(run: Run) -> str:
    every = run.checkpoints_every_min or DEFAULT_EVERY_MIN
    return (f"checkpoint copies off the cluster: {run.checkpoints_to}/{run.run_id}/ (checkpoint_last every "
            f"{every:g} min, checkpoint_best when it changes; uploaded by rank 0's host with its own credentials)")


def summary(run: Run, states, now: float | None = None) -> dict | None:
    """The newest copy off the cluster any reachable host's keeper made (`fab status --json`, the report):
    {update, time, age_s, where} or None, the uploads under way ({host: update}), each host's last error,
    whether a keeper still makes its final copies (`closing`); None when the run copies nothing off the
    cluster."""
    said = [(s.name, o) for s in states if s.reachable and (o := (s.keeper or {}).get("offsite"))]
    if not run.checkpoints_to and not any(o.get("newest") for _, o in said):
        return None
    newest = max((o["newest"] for _, o in said if o.get("newest")), key=lambda n: n["update"], default=None)
    age = round(max(0.0, (now or time.time()) - newest["time"])) if newest else None
    return {"target": run.checkpoints_to,
            "newest": {"update": newest["update"], "time": newest["time"], "age_s": age, "where": newest["where"]}
            if newest else None,
            "uploading": {name: max(o["uploading"]) for name, o in said if o.get("uploading")},
            "errors": {name: o["error"] for name, o in said if o.get("error")},
            "closing": [name for name, o in said if o.get("closing")]}


def status_line(run: Run, states, now: float | None = None) -> str | None:
    """The newest copy any reachable host's keeper made (update, age, where), an upload under way, or the
    last error; None when the run copies nothing off the cluster."""
    copies = summary(run, states, now)
    if copies is None:
        return None
    newest = copies["newest"]
    line = (f"newest copy off the cluster: update {newest['update']:,}, {ago(newest['age_s'])} ago, "
            f"{newest['where']}" if newest else "no copy off the cluster yet")
    for name, update in copies["uploading"].items():
        line += f"; {name} uploading update {update:,}"
    for name, error in copies["errors"].items():
        line += f"; {name}'s last upload failed: {error}"
    return line


def stop_line(run: Run, states, now: float | None = None) -> str | None:
    """What `fab stop` says of the copies off the cluster once the keepers were told: the newest (its
    update, where), and a final copy still uploading (`fab status` says when it is done)."""
    line = status_line(run, states, now)
    copies = summary(run, states, now)
    if line and (copies["uploading"] or copies["closing"]):
        line += ("; the final copy is still uploading (the VMs must stay until it is done): `fab status` "
                 "says when it is")
    return line


def after_stop(run: Run, hosts) -> str | None:
    """`fab stop`'s line of the copies off the cluster, read from the hosts' keepers (stop_line)."""
    return stop_line(run, launch.states(run, hosts)) if run.checkpoints_to else None


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
