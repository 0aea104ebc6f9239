"""A run's keeper on one host: the loop that holds the run (loop: `python -m train.agent.keeper.loop`),
the generations and who decides them (generation, consensus over etcd, etcd), the checkpoint it holds
and serves (holding, replica), its heartbeat, its ranks (ranks, stop, state), its supervision, the
cloud's notices (preemption, notices) and its files."""
