"""The inventory's numeric variables, checked before anything touches a host.

A value that is not a number, or out of range, would otherwise surface late (an argument-spec dump
after the common role ran) or not at all (`network_expected_mbps: 0` made the link threshold 0).
"""

from __future__ import annotations

from typing import NamedTuple

DOCUMENTATION = """
name: preflight_numbers
short_description: one line per numeric inventory variable that is not a number in its range
"""


class Rule(NamedTuple):
    whole: bool  # a whole number (else any number)
    low: float
    low_included: bool
    high: float | None
    meaning: str

    def problem(self, value) -> str:
        """'' when value fits, else what it must be."""
        if isinstance(value, bool):
            number = None
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
        fits = (number is not None and number == number  # not NaN
                and (number >= self.low if self.low_included else number > self.low)
                and (self.high is None or number <= self.high)
                and (not self.whole or number.is_integer()))
        if fits:
            return ""
        kind = "a whole number" if self.whole else "a number"
        bound = f"{'at least' if self.low_included else 'above'} {self.low:g}"
        if self.high is not None:
            bound += f" and at most {self.high:g}"
        return f"must be {kind} {bound} ({self.meaning})"


RULES = {
    "network_expected_mbps": Rule(True, 0, False, None, "the link speed you pay for, Mb/s; to turn the link "
                                                         "check off say so: network_check_link: false"),
    "network_min_ratio": Rule(False, 0, False, 1, "the share of network_expected_mbps a link must reach"),
    "network_min_mbps": Rule(True, 0, False, None, "the threshold in Mb/s; to turn the link check off: "
                                                    "network_check_link: false"),
    "network_iperf_seconds": Rule(True, 1, True, None, "seconds iperf3 measures each pair"),
    "network_iperf_port": Rule(True, 1, True, 65535, "iperf3's TCP port"),
    "train_threads": Rule(True, 1, True, None, "CPU threads per rank"),
    "cpu_ranks": Rule(True, 1, True, None, "training ranks on a CPU host"),
    "data_volume_min_free_gb": Rule(False, 0, True, None, "free space training needs on /data, GB"),
    "preflight_connect_timeout": Rule(False, 0, False, None, "seconds to wait for ssh"),
    "verify_min_free_gb": Rule(False, 0, True, None, "free space verify asks of /data, GB"),
    "verify_allreduce_min_ratio": Rule(False, 0, True, 1, "all_reduce bus bandwidth as a share of the link"),
    "verify_allreduce_iters": Rule(True, 1, True, None, "all_reduce repetitions"),
    "verify_allreduce_timeout": Rule(False, 0, False, None, "seconds the all_reduce may take"),
    "nvidia_driver_reboot_timeout": Rule(False, 0, False, None, "seconds a reboot may take"),
}


def number_problems(hosts: list, hostvars) -> list[str]:
    """['network_expected_mbps is 0 on v100a, v100b: must be a number above 0 (...)', ...]: one line
    per variable and value, naming the hosts that have it; [] when every number fits."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for host in hosts:
        for var, rule in RULES.items():
            if var not in hostvars[host]:
                continue
            value = hostvars[host][var]
            problem = rule.problem(value)
            if problem:
                shown = "empty" if str(value).strip() == "" else str(value)
                found.setdefault((var, shown, problem), []).append(host)
    return [f"{var} is {shown} on {', '.join(names)}: {problem}" for (var, shown, problem), names in found.items()]


class FilterModule:
    def filters(self):
        return {"number_problems": number_problems}
