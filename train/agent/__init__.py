"""The host-side agent: code that runs ON the hosts, installed once by roles/train_env, run as `python -m`:
keeper/ (a run's keeper), trainer/ (fairseq's trainer as tandem runs it), measure/ (what measures a
host and its links), offsite/ (checkpoint copies off the cluster), data/ (prepare-data's stages)."""
