"""benchmarks/gpu.py: the figures a GPU run records."""

import statistics

from benchmarks.gpu import while_busy


def test_gpu_utilization_counts_the_training_not_the_idle_start_and_end():
    # samples every 2 s: CUDA init and data loading, training, then the process winding down
    util = [0, 0, 0, 0, 91, 70, 0, 92, 94, 0, 0, 0]
    assert while_busy(util) == [91, 70, 0, 92, 94]
    assert statistics.median(while_busy(util)) == 91
    assert while_busy([0, 0]) == []
