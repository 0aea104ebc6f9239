"""The host-side agent: code that runs ON the hosts, installed once by roles/train_env, run as `python -m`."""
