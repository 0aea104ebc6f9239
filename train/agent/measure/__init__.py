"""What measures a host and its links: the environment (probe, pins), all_reduce and iperf3, NCCL's
sockets, the samples beside a run (monitor), the GPUs in use (busy_gpus), and the lease that undoes a
benchmark's changes when nobody renews it (lease)."""
