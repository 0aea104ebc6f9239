"""tandem's fault simulator: the keepers' real decision code on a simulated world (tests/sim/world.py),
thousands of seeded fault schedules, named rules checked as it runs (python -m tests.sim --help)."""
