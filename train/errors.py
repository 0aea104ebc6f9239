"""The error a user must fix, raised by every layer (the inventory's values, the cluster, a run).

Its own module so that the lowest layers (train.hostvars) can raise it without importing the
cluster; `train.cluster.ClusterError` is the same class.
"""


class ClusterError(RuntimeError):
    """A problem with the cluster the user must fix; the message names host and cause."""
