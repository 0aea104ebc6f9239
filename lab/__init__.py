"""The tandem lab: N local hosts (network namespaces with their own Debian root and sshd)
on a bridge that exists only inside this machine. Used by `make demo` and the tests,
never by real clusters. Entry point: `python -m lab up|down|status|shape`."""
