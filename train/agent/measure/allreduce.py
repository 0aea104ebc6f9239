"""All-reduce bus bandwidth between hosts (nccl-tests style): provisioning's smoke test, `fab bench-net`'s sweep.

Every host runs one command at the same time, its index among the hosts and every host's ranks
being all it needs to know (roles/verify and benchmarks.net both start it so):

    python -m train.agent.measure.allreduce --node-rank I --ranks-per-host 2,2 --master-addr A [--master-port 29501]
        [--env-file /etc/tandem/env] [--backend auto|gloo|nccl] [--sizes 64M | --min-size 1M --max-size 1G]
        [--iters 5] [--warmup 1] [--budget-s 20] [--json FILE] [--nccl-sockets 2x8]

(`--ranks-per-host`: one per GPU, a CPU host's `cpu_ranks`, as training runs them:
train.cluster.Host.ranks. The older `--gpus-per-host 0,0` means one rank per CPU host, one per GPU.)
That launcher reads the environment file, then becomes the host's rank (global rank = the ranks
of the hosts before it), or torchrun with one worker per rank on a host with several, and under
`--backend nccl` (one worker per GPU, as training starts them); a host with several ranks first
measures its own ranks alone (torchrun on 127.0.0.1, printed as `INTRA {...}`: NVLink, PCIe or
shared memory, no NIC), so that intra-host and inter-host bus bandwidth are told apart.
The cross-host run is then every rank of every host, as training all-reduces: a ring over ranks
numbered host by host crosses each host's NIC once, so its busbw (2(n−1)/n × size / time) is what
each NIC carried per second, comparable with the link for any number of ranks a host. A rank
alone: `--rank R --world-size N --master-addr A`, or under torchrun (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK from the environment). `auto` picks NCCL when CUDA is
available, gloo otherwise. GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name the cluster NIC and
NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD NCCL's TCP connections per peer (provisioning writes
them to /etc/tandem/env; `--nccl-sockets 4x4` tries others for this run: train.agent.measure.nccl_sockets).
Rank 0's report names every NCCL_ variable its ranks ran with. Rank 0 prints

    size(B)  count  type  time(ms)  algbw(GB/s)  busbw(GB/s)

(busbw = algbw x 2(n-1)/n, as nccl-tests) and writes the same figures as JSON. Every rank
checks the reduced values, so a rank that trains alone cannot pass. Exit status: 0 when
every size ran and summed correctly, 1 otherwise.

`--gap-s` idles before each iteration, as the compute between training updates does, and
times the collectives alone (`fab bench-step` uses 1 s: TCP restarts slow start after an
idle period, which a back-to-back loop never shows).

`--min-size/--max-size` sweep the powers of two between them (`fab bench-net`). With
`--budget-s`, a size whose estimated time (twice the previous size's) would make `--iters`
iterations take longer than the budget gets fewer iterations (at least one) and no warm-up
when one iteration alone is over a second: 1 GB through gloo at 100 Mb/s is 80 s an iteration.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from train.agent.measure import nccl_sockets as nccl_sockets_module

UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3}


def parse_size(text: str) -> int:
    """'64M' -> 67108864; '1G', '512K', '1000' (bytes)."""
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGB")
    unit = stripped[len(number):]
    if unit not in UNITS or not number:
        raise ValueError(f"size {text!r} is not like 1M, 64M or 1G")
    return int(float(number) * UNITS[unit])


def sizes_between(smallest: int, largest: int) -> list[int]:
    """Powers of two from `smallest` to `largest` (both rounded down to a power of two)."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"sizes: need 1 <= min <= max, not {smallest}..{largest}")
    size = 1 << (smallest.bit_length() - 1)
    out = []
    while size <= largest:
        out.append(size)
        size *= 2
    return out


def plan(iters: int, warmup: int, estimate_s: float | None, budget_s: float | None) -> tuple[int, int]:
    """(iterations, warm-ups) for a size expected to take `estimate_s` per iteration."""
    if not budget_s or not estimate_s or estimate_s <= 0:
        return iters, warmup
    fitting = int(budget_s // estimate_s)
    return max(1, min(iters, fitting)), (0 if estimate_s > 1.0 else warmup)


def bus_factor(world_size: int) -> float:
    """Bytes a ring all-reduce moves per rank, relative to the buffer: 2(n-1)/n."""
    return 2 * (world_size - 1) / world_size if world_size > 0 else 0.0


@dataclass
class Result:
    size: int  # bytes
    count: int  # elements
    type: str
    time_ms: float  # mean over iterations
    algbw: float  # GB/s (10^9), size / time
    busbw: float  # GB/s, algbw x 2(n-1)/n
    correct: bool


def table(results: list[Result]) -> str:
    lines = [f"{'size(B)':>12} {'count':>11} {'type':>6} {'time(ms)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"]
    for r in results:
        lines.append(f"{r.size:>12} {r.count:>11} {r.type:>6} {r.time_ms:>10.2f} {r.algbw:>12.3f} "
                     f"{r.busbw:>12.3f}" + ("" if r.correct else "  WRONG SUM"))
    return "\n".join(lines)


def measure(dist, torch, size: int, device, world_size: int, rank: int, iters: int, warmup: int,
            gap_s: float = 0.0) -> Result:
    count = max(size // 4, 1)
    buf = torch.empty(count, dtype=torch.float32, device=device)
    correct = True
    expected = world_size * (world_size + 1) / 2  # every rank contributes rank + 1
    elapsed = 0.0
    for i in range(warmup + iters):
        if gap_s:  # idle as between training updates (TCP restarts slow start after an idle period)
            time.sleep(gap_s)
        buf.fill_(rank + 1)
        if gap_s or i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            start = time.perf_counter()
        dist.all_reduce(buf)
        if gap_s and i >= warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed += time.perf_counter() - start
        if i == 0:
            correct = bool(torch.all(buf == expected).item())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not gap_s:
        elapsed = time.perf_counter() - start
    elapsed /= max(iters, 1)
    # The slowest rank's time is the collective's time.
    slowest = torch.tensor([elapsed, 0.0 if correct else 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    elapsed, wrong = slowest.tolist()
    algbw = count * 4 / elapsed / 1e9
    return Result(size=count * 4, count=count, type="float", time_ms=elapsed * 1e3, algbw=algbw,
                  busbw=algbw * bus_factor(world_size), correct=wrong == 0.0)


# ---- the launcher: one command per host, used alike by roles/verify and benchmarks.net ----

def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines (/etc/tandem/env, written by roles/network and roles/train_env); # comments."""
    out = {}
    with open(path) as f:
        for line in f:
            key, eq, value = line.strip().partition("=")
            if eq and key and not key.startswith("#"):
                out[key.strip()] = value.strip().strip("'\"")
    return out


def rank_environment(environ: dict[str, str], env_file: dict[str, str], nccl_sockets: str | None) -> dict[str, str]:
    """The ranks' environment: the launcher's, then the environment file's lines (provisioning's NIC and
    NCCL sockets), then `--nccl-sockets` (a count, THREADSxSOCKETS, or none: NCCL's own defaults)."""
    env = {**environ, **env_file}
    if nccl_sockets is not None:
        for name in nccl_sockets_module.NAMES:
            env.pop(name, None)
        chosen = nccl_sockets_module.parse(nccl_sockets)
        env.update(chosen.env() if chosen else {})
    return env


def nccl_settings(environ: dict[str, str]) -> dict[str, str]:
    """The NCCL_ variables a rank runs with (the report's, beside its busbw)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def rank_argv(node_rank: int, ranks_per_host: list[int], master_addr: str, master_port: int, python: str,
              sweep: list[str], backend: str = "auto") -> list[str]:
    """This host's ranks: the worker itself for one CPU rank (its global rank from the hosts before it),
    torchrun starting one worker per rank for several, and for NCCL (one per GPU, as training)."""
    world = sum(ranks_per_host)
    here = ranks_per_host[node_rank]
    if here > 1 or backend == "nccl":
        torchrun = os.path.join(os.path.dirname(python), "torchrun")
        return [torchrun, "--nnodes", str(len(ranks_per_host)), "--node_rank", str(node_rank),
                "--nproc_per_node", str(here), "--master_addr", master_addr, "--master_port", str(master_port),
                "-m", "train.agent.measure.allreduce", *sweep]
    return [python, "-m", "train.agent.measure.allreduce", "--rank", str(sum(ranks_per_host[:node_rank])),
            "--world-size", str(world), "--master-addr", master_addr, "--master-port", str(master_port), *sweep]


def host_argv(python: str, node_rank: int, ranks: list[int], master_addr: str, master_port: int,
              sweep: list[str], env_file: str | None = None) -> list[str]:
    """The one command a host runs for its part of the all_reduce (what `fab bench-net` starts on each host;
    roles/verify/tasks/allreduce.yml writes the same arguments). `ranks`: every host's ranks."""
    return [python, "-m", "train.agent.measure.allreduce", "--node-rank", str(node_rank),
            "--ranks-per-host", ",".join(map(str, ranks)), "--master-addr", master_addr,
            "--master-port", str(master_port), *(["--env-file", env_file] if env_file else []), *sweep]


def _sweep_args(args: argparse.Namespace) -> list[str]:
    out = ["--backend", args.backend, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--timeout", f"{args.timeout:g}", "--gap-s", f"{args.gap_s:g}"]
    if args.max_size:
        out += ["--min-size", args.min_size or "1M", "--max-size", args.max_size]
    else:
        out += ["--sizes", args.sizes]
    if args.budget_s:
        out += ["--budget-s", f"{args.budget_s:g}"]
    if args.json:
        out += ["--json", args.json]
    return out


def intra_host_argv(ranks: int, master_port: int, python: str, sweep: list[str]) -> list[str]:
    """This host's ranks alone (NVLink, PCIe P2P or shared memory, no NIC): torchrun on 127.0.0.1."""
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    return [torchrun, "--nnodes", "1", "--node_rank", "0", "--nproc_per_node", str(ranks), "--master_addr",
            "127.0.0.1", "--master_port", str(master_port), "-m", "train.agent.measure.allreduce",
            *[a for a in sweep if a not in ("--json",)]]


def measure_intra_host(ranks: int, args: argparse.Namespace) -> None:
    """On a host with several ranks (GPUs, or a CPU host's cpu_ranks) in a cluster of several
    hosts: the all_reduce among this host's ranks first, printed as `INTRA {...}` (verify and
    bench-net show it beside the cross-host figure, so a slow GPU link inside a VM shows as what
    it is). Its failure is reported, not fatal: the cross-host run still measures."""
    sweep = _sweep_args(args)
    if "--json" in sweep:  # the cross-host report owns the --json file
        del sweep[sweep.index("--json"): sweep.index("--json") + 2]
    done = subprocess.run(intra_host_argv(ranks, args.master_port + 1, sys.executable, sweep),
                          capture_output=True, text=True, timeout=args.timeout + 60)
    report = next((line[5:] for line in reversed(done.stdout.splitlines()) if line.startswith("JSON ")), None)
    if report is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        report = json.dumps({"ok": False, "error": f"exit {done.returncode}: {last}"})
    print("INTRA " + report, flush=True)


def ranks_per_host(ranks_text: str | None, gpus_text: str | None) -> list[int]:
    """Every host's ranks: `--ranks-per-host` as given, else one per GPU and one per CPU host
    (`--gpus-per-host`); [] when neither parses.

    >>> ranks_per_host("2,2", None), ranks_per_host(None, "0,4")
    ([2, 2], [1, 4])
    """
    try:
        if ranks_text:
            ranks = [int(r) for r in ranks_text.split(",")]
            return ranks if all(r >= 1 for r in ranks) else []
        return [max(int(g), 1) for g in (gpus_text or "").split(",")]
    except ValueError:
        return []


def ranks_command(args: argparse.Namespace, python: str) -> list[str]:
    """What a host's launcher line (--node-rank mode) becomes: its ranks' command (rank_argv)."""
    ranks = ranks_per_host(args.ranks_per_host, args.gpus_per_host)
    return rank_argv(args.node_rank, ranks, args.master_addr, args.master_port, python, _sweep_args(args),
                     args.backend)


def launch(args: argparse.Namespace) -> int:
    """--node-rank mode: read the environment file, then become this host's rank(s) (exec);
    a host with several ranks among several hosts measures its ranks alone first."""
    ranks = ranks_per_host(args.ranks_per_host, args.gpus_per_host)
    if not 0 <= args.node_rank < len(ranks):
        given = (f"--ranks-per-host {args.ranks_per_host}" if args.ranks_per_host
                 else f"--gpus-per-host {args.gpus_per_host}")
        raise SystemExit(f"--node-rank {args.node_rank} with {given}: the host's index into every host's ranks "
                         "(--ranks-per-host 2,2) or GPU count (--gpus-per-host, 0 for a CPU host)")
    from_file = read_env_file(args.env_file) if args.env_file and os.path.exists(args.env_file) else {}
    env = rank_environment(dict(os.environ), from_file, args.nccl_sockets)
    os.environ.clear()
    os.environ.update(env)
    if ranks[args.node_rank] > 1 and len(ranks) > 1 and not args.skip_intra:
        measure_intra_host(ranks[args.node_rank], args)
    argv = ranks_command(args, sys.executable)
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 1  # not reached


# ---- a rank ----

def _nccl_sockets_option(text: str) -> str:
    try:
        return nccl_sockets_module.option(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m train.agent.measure.allreduce", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node-rank", type=int, help="launcher: this host's index among the hosts (rank 0's host first)")
    p.add_argument("--ranks-per-host", help="launcher: every host's ranks, comma-separated (one per GPU, a CPU "
                   "host's cpu_ranks)")
    p.add_argument("--gpus-per-host", help="launcher, without --ranks-per-host: every host's GPUs, comma-separated "
                   "(0: a CPU host, one rank)")
    p.add_argument("--env-file", help="launcher: KEY=VALUE lines to set first (/etc/tandem/env)")
    p.add_argument("--nccl-sockets", type=_nccl_sockets_option,
                   help="launcher: NCCL's TCP sockets per peer for this run, a count or THREADSxSOCKETS (2x8), or "
                        "none for NCCL's defaults (instead of the environment file's)")
    p.add_argument("--skip-intra", action="store_true",
                   help="launcher: no all_reduce among a host's own ranks first (fab bench-step's per-cap figure)")
    p.add_argument("--rank", type=int, default=int(env.get("RANK", 0)))
    p.add_argument("--world-size", type=int, default=int(env.get("WORLD_SIZE", 1)))
    p.add_argument("--local-rank", type=int, default=int(env.get("LOCAL_RANK", 0)),
                   help="GPU index on this host (NCCL)")
    p.add_argument("--master-addr", default=env.get("MASTER_ADDR", "127.0.0.1"))
    p.add_argument("--master-port", type=int, default=int(env.get("MASTER_PORT", 29501)))
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--sizes", default="64M", help="comma-separated buffer sizes, e.g. 1M,16M,256M")
    p.add_argument("--min-size", help="sweep powers of two from this size (with --max-size)")
    p.add_argument("--max-size", help="... up to this size, e.g. 1G")
    p.add_argument("--budget-s", type=float, help="seconds per size: fewer iterations for slow sizes")
    p.add_argument("--gap-s", type=float, default=0.0,
                   help="idle seconds before each iteration (as compute between updates); times only the collective")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for every rank")
    p.add_argument("--json", help="where rank 0 writes the results ('-' for stdout only)")
    return p


def sizes_of(args: argparse.Namespace) -> list[int]:
    if args.max_size:
        return sizes_between(parse_size(args.min_size or "1M"), parse_size(args.max_size))
    return [parse_size(s) for s in args.sizes.split(",") if s.strip()]


def sweep(dist, torch, args: argparse.Namespace, sizes: list[int], device) -> list[Result]:
    results: list[Result] = []
    for size in sizes:
        # the slowest rank's time (the same on every rank, so every rank plans alike)
        estimate = results[-1].time_ms / 1e3 * size / results[-1].size if results else None
        iters, warmup = plan(args.iters, args.warmup, estimate, args.budget_s)
        results.append(measure(dist, torch, size, device, args.world_size, args.rank, iters, warmup, args.gap_s))
        if args.rank == 0 and args.budget_s:  # progress for the controller, which tails the output
            print(f"# {size} B: {results[-1].time_ms:.1f} ms x {iters}", flush=True)
    return results


def write_report(args: argparse.Namespace, torch, backend: str, device, hosts: list, results: list[Result]) -> None:
    """Rank 0's table and its JSON line (`JSON {...}`, what the launchers read back)."""
    report = {
        "benchmark": "all_reduce",
        "backend": backend,
        "world_size": args.world_size,
        "hosts": hosts,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "ok": all(r.correct for r in results),
        "nccl_env": nccl_settings(dict(os.environ)),  # what NCCL read (or would have: gloo ignores them)
        "results": [asdict(r) for r in results],
    }
    print(f"# all_reduce, {backend}, {args.world_size} ranks on {', '.join(dict.fromkeys(hosts))}")
    print(table(results))
    text = json.dumps(report, indent=2)
    if args.json and args.json != "-":
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print("JSON " + json.dumps(report))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sizes = sizes_of(args)  # a bad size fails here, before any rendezvous
    if args.node_rank is not None:
        return launch(args)

    import torch
    import torch.distributed as dist

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")
    # Under torchrun its agent already serves the rendezvous store on the master port: join it.
    init = "env://" if "TORCHELASTIC_RUN_ID" in os.environ else f"tcp://{args.master_addr}:{args.master_port}"
    dist.init_process_group(backend, init_method=init, rank=args.rank, world_size=args.world_size,
                            timeout=dt.timedelta(seconds=args.timeout))
    try:
        hosts: list = [None] * args.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        results = sweep(dist, torch, args, sizes, device)
    finally:
        dist.destroy_process_group()
    if args.rank == 0:
        write_report(args, torch, backend, device, hosts, results)
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
