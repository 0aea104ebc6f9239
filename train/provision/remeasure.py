"""Whether figures measured before (iperf3 between the hosts, the all_reduce) still stand, or must
be measured again: provisioning's reruns skip minutes of measuring when nothing changed.

Used by roles/network and roles/verify (their filter plugins) on the controller.
"""

from __future__ import annotations

from datetime import datetime

MODES = {"true": "auto", "yes": "auto", "1": "auto", "on": "auto", "auto": "auto", "always": "always",
         "false": "never", "no": "never", "0": "never", "off": "never", "never": "never", "": "never"}


def mode(value) -> str:
    """network_measure -> auto (when an input changed), always, or never."""
    try:
        return MODES[str(value).strip().lower()]
    except KeyError:
        raise ValueError(f"network_measure: {value!r} is not auto, always or never") from None


def reason(before: dict | None, inputs: dict, passed: bool, measured_at: str | None, how: str,
           max_age_h: float, now_iso: str) -> str:
    """'' when the figures measured before stand, else why they are measured again.
    before/inputs: what the figures depended on then and now ({name: text}); passed: whether they
    passed their check then."""
    if how == "always":
        return "asked to (network_measure=always)"
    if before is None or not measured_at:
        return "no figures measured before"
    changed = sorted(k for k in set(before) | set(inputs) if before.get(k) != inputs.get(k))
    if changed:
        return "what they depend on changed: " + ", ".join(changed)
    if not passed:
        return "the figures before did not pass"
    try:
        age_h = (datetime.fromisoformat(now_iso.rstrip("Z")).replace(tzinfo=None)
                 - datetime.fromisoformat(measured_at.rstrip("Z")).replace(tzinfo=None)).total_seconds() / 3600
    except ValueError:
        return "the figures before have no valid time"
    if age_h > float(max_age_h):
        return f"the figures before are {age_h:.0f} h old (network_measure_max_age_h: {max_age_h:g})"
    return ""
