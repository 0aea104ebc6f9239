"""The errors a user must fix, raised by every layer, and how every fab task ends (docs/cli.md): 0 done,
1 failed, 2 bad input, 3 refused by a check before anything starts (an `--accept-...` option overrides
it, or the fix it names). OptionError and Refused choose 2 and 3 (train.cli.executor.cluster_task);
ClusterError, a problem with the cluster, is 1.

Its own module so that the lowest layers (train.hostvars) can raise them without importing the
cluster; `train.cluster.ClusterError` is the same class.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A problem with the cluster the user must fix; the message names host and cause."""

DONE, FAILED, BAD_INPUT, REFUSED = 0, 1, 2, 3


class OptionError(ValueError):
    """A bad option value or combination, said in one line that names the option and what it accepts:
    `--update-freq: expected a whole number >= 1, got 'x'`."""

    def __init__(self, option: str, message: object):
        self.option = "--" + option.lstrip("-").replace("_", "-")
        text = " ".join(str(message).split())  # one line, whatever the parser said
        super().__init__(text if text.startswith(self.option) else f"{self.option}: {text}")


class BadInventory(OptionError):
    """Bad input that is the inventory's, not an option's (none named, a host it does not describe): exit 2,
    said as it is, naming the host or file: `v100b: the inventory gives no gpus: ...`."""

    def __init__(self, message: object):
        ValueError.__init__(self, " ".join(str(message).split()))
        self.option = ""


class Refused(ClusterError):
    """A check refused to start (the network would take most of each step, fewer hosts would be
    faster) and an `--accept-...` option would let it through."""
