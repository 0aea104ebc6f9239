"""tandem's per-run side (fabfile.py): data/, run/ (a run's life: train.run.session), plan/ (the cost
model and the link), agent/ (what runs on the hosts), report/, watch/; cluster.py shared."""
