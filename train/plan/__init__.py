"""Planning a run on the link it has: the cost model (model), the link measured and capped (link),
the verdict from measured figures (predict), the benchmarks' records it reads (measurements)."""
