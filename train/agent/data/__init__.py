"""prepare-data's stages, run on the host that prepares (rank 0's): `python -m train.agent.data`."""
