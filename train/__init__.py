"""tandem's per-run side (fabfile.py), by concern: cli/ (what every fab task shares), onboard/ (`fab init`),
provision/ (what provisioning runs on the controller), hosts/ (the controller's reach into its hosts),
recipe/ (what a run is), data/, plan/ (the cost model and the link), run/ (a run's life:
train.run.session), watch/, report/, agent/ (what runs on the hosts). Loose: cluster.py (the inventory's
hosts, Fabric's groups), errors.py (the errors and exit codes), hostvars.py, inventory_cache.py."""
