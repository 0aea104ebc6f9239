"""Benchmarks before training: bandwidth, step time against bandwidth, and the cost model."""
