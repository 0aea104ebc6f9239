"""The report: a run's logs, samples and benchmarks collected, analysed, plotted and put on one page."""
