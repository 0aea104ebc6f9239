"""`fab bench-net`: how fast can the hosts talk, and does all_reduce get that speed?

1. iperf3 between every ordered pair of hosts (train.plan.link; raw JSON kept).
2. train.agent.measure.allreduce on every host at once (every rank training runs: one per GPU, a CPU
   host's `cpu_ranks`; NCCL under torchrun when every host has GPUs, gloo otherwise: the lab),
   with the NCCL settings provisioning wrote to /etc/tandem/env (the cluster NIC, the TCP sockets
   per peer from the iperf3 stream count that reached the link; `nccl_sockets` tries others for
   this run: train.agent.measure.nccl_sockets), buffer sizes from `--min-size` to
   `--max-size` by powers of two: the host-side agent roles/train_env installed, started
   detached with a pid file, followed from here, and killed by that pid on error or Ctrl-C.
   A host with several ranks first measures them alone (intra-host: NVLink, PCIe or shared
   memory, no NIC), printed per host before the cross-host table.
3. The nccl-tests table plus one column: efficiency = busbw / the slowest iperf3 pair
   (both in bytes per second). For 2 ranks busbw = algbw = size / time: each rank sends and
   receives the whole buffer once, so it is directly comparable with the link. With several
   ranks a host the ring over ranks numbered host by host crosses each NIC once, and busbw
   (2(n−1)/n × size / time) is again what each NIC carried: the inter-host figure.
   `threshold` fails the run when the efficiency of the sizes ≥ 256 MB (or the largest size
   when the sweep stops below) is lower.
4. One line: NCCL's busbw at the largest size beside iperf3's slowest pair, both in Gbit/s, with
   the socket threads x sockets per thread NCCL ran with; on CPU hosts it says NCCL was not
   measured (gloo's figures stand in the table).

Defaults: 1M..1G on GPU hosts; on CPU hosts (the lab) 1M..256M, because gloo reduces on
the CPU and 1 GB through a 100 Mb/s link is 80 s an iteration; each size gets `budget_s`
seconds (fewer iterations for slow sizes). JSON: reports/bench/net-<time>.json and
reports/bench/net-latest.json (train.plan.measurements).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict
from datetime import UTC, datetime

from train.agent.measure import allreduce, iperf, nccl_sockets
from train.agent.measure.allreduce import parse_size
from train.cluster import ClusterError, Host, placement, run_all, run_each, world_size
from train.hosts.remote import venv_of
from train.plan import link, measurements
from train.run.command import ENV_FILE

# Each host's all_reduce output and pid file (the code is installed): one directory per login user, as the
# iperf3 pid file (train.plan.link.iperf_pidfile): another user's (root's, a colleague's) is not writable.
REMOTE_DIR = "/tmp/tandem-bench-$(id -un)"
LARGE = 256 * 1024**2  # the sizes the efficiency target is about


def default_max_size(hosts: list[Host]) -> str:
    return "1G" if all(h.gpus > 0 for h in hosts) else "256M"


def backend_for(hosts: list[Host]) -> str:
    """NCCL where every host has GPUs (one rank per GPU, as training); gloo otherwise (NCCL needs a GPU per rank)."""
    return "nccl" if all(h.gpus > 0 for h in hosts) else "gloo"


def size_text(size: int) -> str:
    """268435456 -> '256 MiB'."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def sockets_text(nccl_env: dict[str, str]) -> str:
    """'2x8' from NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD; NCCL's defaults where neither is set."""
    threads, per_thread = (nccl_env.get(name) for name in nccl_sockets.NAMES)
    if threads is None and per_thread is None:
        return "NCCL's defaults"
    return f"{threads or 1}x{per_thread or 1} sockets"


def versus_iperf3(rows: list[dict], link_mbps: float | None, backend: str, nccl_env: dict[str, str],
                  streams: int, cpu_hosts: list[str]) -> str:
    """NCCL's all_reduce busbw (GB/s x 8 = Gbit/s) at the largest size beside iperf3's slowest pair (Mbit/s / 1000),
    or why NCCL was not measured."""
    top = rows[-1]
    busbw = top["busbw"] * 8
    measured = f"{link_mbps / 1e3:.2f} Gbit/s" if link_mbps else "no figure"
    ratio = f", {busbw * 1e3 / link_mbps:.0%}" if link_mbps else ""
    flows = f"{streams} stream{'s' if streams > 1 else ''}"
    if backend != "nccl":
        return (f"NCCL not measured: {', '.join(cpu_hosts)} ha{'ve' if len(cpu_hosts) > 1 else 's'} no GPU "
                f"(gloo's busbw at {size_text(top['size'])}: {busbw:.2f} Gbit/s; iperf3 {measured}{ratio})")
    return (f"NCCL busbw {busbw:.2f} Gbit/s at {size_text(top['size'])} ({sockets_text(nccl_env)}) vs iperf3 "
            f"{measured} (slowest pair, {flows}){ratio}")


def slowest_pair_streams(pairs: list, hosts: list[Host]) -> int:
    """The iperf3 streams of the pair link_mbps reports (the slowest): its sender's, as train.plan.link
    measured it; hosts[0]'s where no pair measured."""
    slowest = min((p for p in pairs if p.mbps), key=lambda p: p.mbps, default=None)
    sender = next((h for h in hosts if slowest and h.name == slowest.src), hosts[0])
    return iperf.streams(sender.var("network_iperf_streams"), sender.var("network_expected_mbps"))


def with_efficiency(results: list[dict], link_mbps: float | None) -> list[dict]:
    """Each all_reduce row plus `efficiency` = busbw / link (None without a link figure)."""
    out = []
    for row in results:
        eff = row["busbw"] * 8e9 / (link_mbps * 1e6) if link_mbps else None
        out.append({**row, "efficiency": eff})
    return out


def table(rows: list[dict]) -> str:
    """nccl-tests' columns, with units, plus the efficiency against the measured link."""
    lines = [f"{'size(B)':>12} {'count':>11} {'type':>6} {'time(ms)':>10} {'algbw(GB/s)':>12} "
             f"{'busbw(GB/s)':>12} {'busbw/link':>10}"]
    for r in rows:
        eff = f"{r['efficiency']:>9.0%}" if r.get("efficiency") is not None else f"{'-':>9}"
        lines.append(f"{r['size']:>12} {r['count']:>11} {r['type']:>6} {r['time_ms']:>10.2f} {r['algbw']:>12.4f} "
                     f"{r['busbw']:>12.4f} {eff:>10}" + ("" if r.get("correct", True) else "  WRONG SUM"))
    return "\n".join(lines)


def pairs_table(pairs: list[link.Pair]) -> str:
    lines = [f"{'pair':<24} {'Mbit/s':>9} {'retransmits':>11}"]
    for p in pairs:
        rate = f"{p.mbps:>9.1f}" if p.mbps is not None else f"{'-':>9}"
        lines.append(f"{p.src + ' -> ' + p.dst:<24} {rate} {p.retransmits if p.retransmits is not None else '-':>11}"
                     + (f"  {p.error}" if p.error else ""))
    return "\n".join(lines)


def verdict(rows: list[dict], threshold: float | None) -> tuple[bool, list[str]]:
    """(ok, reasons): the large sizes' efficiency against `threshold` (a fraction)."""
    if threshold is None:
        return True, []
    checked = [r for r in rows if r["size"] >= LARGE] or rows[-1:]
    reasons = []
    for r in checked:
        if r.get("efficiency") is None:
            reasons.append(f"{r['size']} B: no link figure to compare with (iperf3 failed)")
        elif r["efficiency"] < threshold:
            reasons.append(f"{r['size']} B: busbw {r['busbw'] * 8e3:.0f} Mbit/s is {r['efficiency']:.0%} of the "
                           f"link, below the threshold of {threshold:.0%}")
    if not any(r.get("correct", True) for r in rows):
        reasons.append("all_reduce summed wrongly")
    return not reasons, reasons


def host_info(hosts: list[Host]) -> dict[str, dict]:
    """NIC name, speed (ethtool's; often -1 or absent on virtual NICs), MTU, kernel, iperf3."""
    script = ("n={nic}; echo \"$(cat /sys/class/net/$n/speed 2>/dev/null || echo -1)\"; "
              "cat /sys/class/net/$n/mtu 2>/dev/null || echo 0; uname -r; "
              "iperf3 --version 2>/dev/null | head -n 1")
    answers = run_each(hosts, {h.name: script.format(nic=shlex.quote(link.nic_of(h))) for h in hosts})
    info = {}
    for h in hosts:
        lines = answers[h.name].stdout.splitlines() + ["", "", "", ""]
        info[h.name] = {"address": h.cluster_address, "ssh_address": h.address, "nic": h.nic, "gpus": h.gpus,
                        "speed_mbps": int(lines[0]) if lines[0].lstrip("-").isdigit() else None,
                        "mtu": int(lines[1]) if lines[1].isdigit() else None,
                        "kernel": lines[2], "iperf3": lines[3],
                        "expected_mbps": h.var("network_expected_mbps")}
    return info


def allreduce_commands(hosts: list[Host], sizes: str, iters: int, warmup: int, budget_s: float,
                       port: int, timeout: float, gap_s: float = 0.0, intra: bool = True, backend: str = "auto",
                       nccl_sockets: str | None = None) -> dict[str, str]:
    """Each host's detached all_reduce job: train.agent.measure.allreduce's launcher (installed by roles/train_env,
    as roles/verify runs it), its output and pid file in REMOTE_DIR. `intra`: a host with several
    ranks measures them alone first. `backend`: nccl runs torchrun with one worker per GPU; the
    launcher reads /etc/tandem/env first (the NIC, NCCL's sockets), `nccl_sockets` replaces its sockets."""
    mn, sweep, mx = sizes.partition("..")
    chosen = ["--min-size", mn, "--max-size", mx] if sweep else ["--sizes", sizes]  # 'A..B' or 'A,B,...'
    common = [*chosen, "--iters", str(iters), "--warmup", str(warmup), "--budget-s", f"{budget_s:g}",
              "--timeout", f"{timeout:g}", "--gap-s", f"{gap_s:g}", *([] if intra else ["--skip-intra"]),
              *([] if backend == "auto" else ["--backend", backend]),
              *([] if nccl_sockets is None else ["--nccl-sockets", nccl_sockets])]
    ranks = [h.ranks for h in hosts]
    out = {}
    for node, h in enumerate(hosts):
        job = shlex.join(allreduce.host_argv(f"{venv_of(h)}/bin/python", node, ranks, hosts[0].cluster_address, port,
                                             common, env_file=ENV_FILE))
        out[h.name] = (f"mkdir -p {REMOTE_DIR} && cd {REMOTE_DIR} && "
                       f"{{ setsid nohup {job} > {REMOTE_DIR}/allreduce.out 2>&1 < /dev/null & "
                       f"echo $! > {REMOTE_DIR}/allreduce.pid; }}")
    return out


KILL = (f"p=$(cat {REMOTE_DIR}/allreduce.pid 2>/dev/null) && kill -0 -- -$p 2>/dev/null && "
        f"{{ kill -TERM -- -$p; sleep 1; kill -KILL -- -$p 2>/dev/null; echo killed; }}; "
        f"rm -f {REMOTE_DIR}/allreduce.pid; true")
ALIVE = f"p=$(cat {REMOTE_DIR}/allreduce.pid 2>/dev/null) && kill -0 $p 2>/dev/null && echo running || echo done"


def run_allreduce(hosts: list[Host], sizes: str, iters: int = 5, warmup: int = 1, budget_s: float = 20,
                  port: int = 29501, timeout: float = 1800, on_line=None, gap_s: float = 0.0,
                  intra: bool = True, backend: str = "auto", nccl_sockets: str | None = None) -> dict:
    """Run the sweep on every host at once; rank 0's JSON report, with `intra` ({host: its ranks alone})
    where hosts run several. Every job is stopped afterwards."""

    commands = allreduce_commands(hosts, sizes, iters, warmup, budget_s, port, timeout, gap_s, intra, backend,
                                  nccl_sockets)
    try:
        bad = run_each(hosts, commands).problems()
        if bad:
            raise ClusterError("could not start all_reduce on every host:\n  " + "\n  ".join(bad))
        deadline = time.monotonic() + timeout
        seen = 0
        peer_ended: float | None = None  # a rank > 0 that ended while rank 0 still waits (e.g. no torch there)
        while True:
            time.sleep(1)
            states = run_all(hosts, ALIVE + f"; cat {REMOTE_DIR}/allreduce.out 2>/dev/null | grep -c '^# ' ")
            first = states[hosts[0].name]
            if on_line and first.ok:
                count = int((first.stdout.split() or ["", "0"])[-1])
                if count > seen:
                    seen = count
                    on_line(count)
            done = {n: (r.ok and r.stdout.startswith("done")) for n, r in states.items()}
            if all(done.values()):
                break
            if any(done[h.name] for h in hosts[1:]) and peer_ended is None:
                peer_ended = time.monotonic()
            if done[hosts[0].name] or time.monotonic() > deadline or (
                    peer_ended is not None and time.monotonic() - peer_ended > 30):
                break  # rank 0 ended (error), a peer is gone, or too slow: the others are stopped below
        outputs = run_all(hosts, f"cat {REMOTE_DIR}/allreduce.out")
    finally:
        run_all(hosts, KILL)
    rank0 = outputs[hosts[0].name].stdout
    report = next((json.loads(line[5:]) for line in rank0.splitlines() if line.startswith("JSON ")), None)
    if report is None:
        tails = "\n".join(f"  {n}: " + " | ".join((r.stdout or r.why).strip().splitlines()[-3:])
                          for n, r in outputs.items())
        raise ClusterError(f"all_reduce gave no result:\n{tails}")
    intra = intra_reports({name: r.stdout for name, r in outputs.items()})
    return {**report, "intra": intra} if intra else report


def intra_reports(outputs: dict[str, str]) -> dict[str, dict]:
    """{host: the all_reduce among its own ranks}: the `INTRA {...}` line train.agent.measure.allreduce prints
    on a host with several ranks before the cross-host run (none on one-rank hosts)."""
    found = {}
    for name, text in outputs.items():
        lines = [line[6:] for line in text.splitlines() if line.startswith("INTRA ")]
        if lines:
            try:
                found[name] = json.loads(lines[-1])
            except ValueError:
                found[name] = {"ok": False, "error": f"unreadable: {lines[-1][:200]}"}
    return found


def intra_table(intra: dict[str, dict]) -> str:
    """Each host's ranks among themselves (no NIC): the intra-host bus bandwidth, per size."""
    lines = [f"{'host':<10} {'ranks':>5} {'size(B)':>12} {'time(ms)':>10} {'busbw(GB/s)':>12}"]
    for host, report in intra.items():
        if not report.get("ok") and not report.get("results"):
            lines.append(f"{host:<10} {'-':>5} failed: {report.get('error') or 'the reduced values were wrong'}")
            continue
        for r in report.get("results") or []:
            lines.append(f"{host:<10} {report.get('world_size', '?'):>5} {r['size']:>12} {r['time_ms']:>10.2f} "
                         f"{r['busbw']:>12.4f}" + ("" if r.get("correct", True) else "  WRONG SUM"))
    return "\n".join(lines)


def bench_net(hosts: list[Host], min_size: str = "1M", max_size: str | None = None, iters: int = 5,
              budget_s: float = 20, iperf_seconds: float = 3, threshold: float | None = None,
              port: int = 29501, nccl_sockets: str | None = None, say=print) -> dict:
    """The whole benchmark; returns the report (also written as JSON)."""
    if len(hosts) < 2:
        raise ClusterError("bench-net needs at least two hosts")
    max_size = max_size or default_max_size(hosts)
    parse_size(min_size), parse_size(max_size)  # reject bad sizes before anything runs
    info = host_info(hosts)
    caps = link.caps(hosts)
    say(f"iperf3 between every ordered pair of {', '.join(h.name for h in hosts)} ({iperf_seconds:g} s each)")
    pairs, raw = link.iperf(hosts, "all", seconds=iperf_seconds)
    say(pairs_table(pairs))
    link_mbps = link.link_mbps(pairs)
    several = any(h.ranks > 1 for h in hosts)
    backend = backend_for(hosts)
    say(f"all_reduce {min_size}..{max_size} across {world_size(hosts)} ranks ({placement(hosts)}, {backend})"
        + ("; each host's ranks alone first" if several else ""))
    result = run_allreduce(hosts, f"{min_size}..{max_size}", iters=iters, budget_s=budget_s, port=port,
                           on_line=lambda n: say(f"  {n} sizes done"), backend=backend, nccl_sockets=nccl_sockets)
    rows = with_efficiency(result["results"], link_mbps)
    ok, reasons = verdict(rows, threshold)
    if result.get("intra"):
        say(f"# intra-host: all_reduce among each host's own ranks ({result['backend']}, no NIC)")
        say(intra_table(result["intra"]))
        for h, r in result["intra"].items():
            if not r.get("ok"):
                say(f"{h}: all_reduce among its own ranks failed: {r.get('error') or 'wrong sums'}")
    say(f"# inter-host: all_reduce, {result['backend']}, {result['world_size']} ranks on {len(hosts)} hosts; "
        f"link {link_mbps} Mbit/s (slowest iperf3 pair)")
    say(table(rows))
    streams = slowest_pair_streams(pairs, hosts)
    nccl_env = result.get("nccl_env") or {}
    say(versus_iperf3(rows, link_mbps, result["backend"], nccl_env, streams, [h.name for h in hosts if h.gpus == 0]))
    now = datetime.now(UTC)
    report = {
        "benchmark": "bench-net",
        "timestamp": now.isoformat(timespec="seconds"),
        "hosts": info,
        "caps": caps,
        "versions": {"torch": result.get("torch"), "cuda": result.get("cuda"), "backend": result.get("backend"),
                     "device": result.get("device"), "iperf3": sorted({i["iperf3"] for i in info.values()})},
        "iperf3": {"seconds": iperf_seconds, "pairs": [asdict(p) for p in pairs], "raw": raw},
        "link_mbps": link_mbps,
        # NCCL beside iperf3: measured only on GPU hosts (the lab's CPU hosts run gloo)
        "nccl": {"measured": result["backend"] == "nccl", "settings": nccl_env,
                 "busbw_gbps": rows[-1]["busbw"] * 8 if result["backend"] == "nccl" else None,
                 "iperf3_gbps": link_mbps / 1e3 if link_mbps else None, "iperf3_streams": streams},
        "allreduce": {**{k: v for k, v in result.items() if k != "results"}, "results": rows},
        "threshold": threshold,
        "ok": ok,
        "problems": reasons,
    }
    report["path"] = str(measurements.write(report, "net", now))
    return report


def run(hosts: list[Host], min_size: str = "1M", max_size: str | None = None, iters: int | str = 5,
        budget_s: float | str = 20, iperf_seconds: float | str = 3, threshold: float | str | None = None,
        port: int | str = 29501, nccl_sockets: str | None = None, say=print) -> dict:
    """`fab bench-net`: the benchmark from the task's option values as given (numbers may come as
    text); says where the JSON is, and raises when the efficiency is below `threshold`."""
    report = bench_net(hosts, min_size=min_size, max_size=max_size, iters=int(iters), budget_s=float(budget_s),
                       iperf_seconds=float(iperf_seconds), port=int(port),
                       threshold=float(threshold) if threshold is not None else None,
                       nccl_sockets=nccl_sockets, say=say)
    say(f"JSON {report['path']}")
    if not report["ok"]:
        raise ClusterError("below the threshold:\n  " + "\n  ".join(report["problems"]))
    return report
