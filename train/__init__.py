"""tandem's per-run side (fabfile.py): data/, run/, agent/ (what runs on the hosts), report/; cluster.py shared."""
