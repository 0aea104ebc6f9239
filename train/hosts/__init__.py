"""The controller's reach into its hosts, below every task: where things live on a host (paths: the
runs, the venv), the command lines of the host-side agent (remote), copies from one host to its peers
(peercopy). train.cluster (the inventory's hosts, Fabric's groups) is beside it."""
