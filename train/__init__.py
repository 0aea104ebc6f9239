"""tandem's per-run jobs: data, launch, monitoring, report (driven by fabfile.py)."""
