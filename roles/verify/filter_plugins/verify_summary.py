"""verify_summary: every host's probed state + the network figures + the all_reduce -> one table
and the list of problems (empty when the cluster is ready).

The version comparison is train.agent.measure.probe's, the one `fab train`'s preflight makes."""

from __future__ import annotations

import json

from train.agent.measure.probe import versions_differ
from train.provision import remeasure

DOCUMENTATION = """
name: verify_summary
short_description: the provisioning verification table and its problems
"""

COLUMNS = ("host", "GPUs", "driver", "torch", "CUDA", "NIC", "speed(Mb/s)", "min out(Mb/s)", "min in(Mb/s)",
           "/data", "free(GB)", "python", "fairseq")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def host_problems(host: str, h: dict, net: dict) -> list[str]:
    """What is wrong with one host: GPUs, the venv, /data, its network figures."""
    problems = []
    venv = h.get("venv") or {}
    promised, found = int(h.get("gpus_promised", 0)), len(h.get("gpus") or [])
    if found != promised:
        problems.append(f"{host}: expected {promised} GPUs, nvidia-smi shows {found}")
    if not venv:
        problems.append(f"{host}: the training venv does not import torch and fairseq ({h.get('venv_error')})")
    elif promised > 0 and not venv.get("cuda_available"):
        problems.append(f"{host}: torch {venv.get('torch')} does not see CUDA")
    data = h.get("data") or {}
    if h.get("data_expected") and not data:
        problems.append(f"{host}: nothing is mounted at /data")
    if data and "noatime" not in str(data.get("options", "")):
        problems.append(f"{host}: /data is mounted without noatime")
    if float(h.get("free_gb", 0)) < float(h.get("min_free_gb", 0)):
        problems.append(f"{host}: /data has {h.get('free_gb')} GB free, training needs {h.get('min_free_gb')} GB")
    if not net:
        problems.append(f"{host}: no network figures (run the network role: --tags network)")
    return problems


def host_row(host: str, h: dict, net: dict, out: list[float], into: list[float]) -> list[str]:
    venv = h.get("venv") or {}
    data = h.get("data") or {}
    gpu_names = sorted(set(h.get("gpus") or []))
    return [
        host,
        f"{len(h.get('gpus') or [])}/{int(h.get('gpus_promised', 0))}"
        + (f" {', '.join(gpu_names)}" if gpu_names else ""),
        h.get("driver") or "-",
        venv.get("torch", "-"),
        f"{venv.get('cuda')} ({venv.get('cuda_devices', 0)} dev)" if venv.get("cuda_available") else "no",
        net.get("nic", "-"),
        str(net.get("speed_mbps") or "unknown"),
        f"{min(out):.0f}" if out else "-",
        f"{min(into):.0f}" if into else "-",
        f"{data.get('source', '-')} {data.get('fstype', '')}".strip() if data else "not mounted",
        str(h.get("free_gb", "-")),
        venv.get("python", "-"),
        venv.get("fairseq", "-"),
    ]


def ranks_per_host(hosts: list, hostvars) -> list:
    """Every host's training ranks, as train.cluster.Host.ranks counts them: one per GPU, a CPU
    host's `cpu_ranks` (default 1). train.agent.measure.allreduce's --ranks-per-host."""
    out = []
    for host in hosts:
        v = hostvars[host]
        gpus = int(v.get("gpus", 0) or 0)
        out.append(gpus if gpus > 0 else int(v.get("cpu_ranks") or 1))
    return out


def intra_allreduce(hosts: list, hostvars, result_var: str = "__verify_allreduce") -> dict:
    """{host: the all_reduce among that host's own ranks}: the `INTRA {...}` line train.agent.measure.allreduce
    prints on a host with several ranks (GPUs, or cpu_ranks) before the cross-host run. Empty on
    one-rank hosts."""
    found = {}
    for host in hosts:
        lines = (hostvars[host].get(result_var) or {}).get("stdout_lines") or []
        intra = [line[6:] for line in lines if line.startswith("INTRA ")]
        if intra:
            found[host] = json.loads(intra[-1])
    return found


def intra_lines(intra: dict) -> tuple[list, list]:
    """(lines, problems) of each host's ranks among themselves (NVLink, PCIe, shared memory): the
    intra-host bus bandwidth, no NIC."""
    lines, problems = [], []
    for host, report in sorted(intra.items()):
        if not report.get("ok"):
            problems.append(f"{host}: all_reduce among its own ranks failed: "
                            + str(report.get("error") or "the reduced values were wrong"))
        for r in report.get("results") or []:
            lines.append(f"{host}: all_reduce {report.get('backend')} x{report.get('world_size')} within the host "
                         f"{r['size'] / 2**20:.0f} MiB: busbw {r['busbw']:.3f} GB/s")
    return lines, problems


def allreduce_lines(allreduce: dict, link: float | None, n_hosts: int, min_ratio: float,
                    measured: float | None = None, expected: float | None = None) -> tuple[list, list]:
    """(lines, problems) of the all_reduce: each host's ranks among themselves (intra-host), then each
    size's bus bandwidth across the hosts (inter-host: every rank of every host, whose ring crosses
    each NIC once) against the link. Shown against the measured link (iperf3's slowest
    pair), the expected one said apart; checked against `link`, the slower of the two (on a fast
    virtual link the CPU, not the wire, bounds gloo)."""
    lines, problems = intra_lines(allreduce.get("intra") or {})
    if not allreduce.get("ok"):
        problems.append("all_reduce failed: " + str(allreduce.get("error") or "the reduced values were wrong"))
    for r in allreduce.get("results") or []:
        busbw_mbps = r["busbw"] * 8000
        verdict = ""
        if link and n_hosts > 1:
            ratio = busbw_mbps / link
            shown = measured or link
            verdict = (f" = {busbw_mbps / shown:.2f} x the measured link ({shown:.0f} Mb/s, iperf3's slowest pair)"
                       + (f"; expected link {expected:.0f} Mb/s" if expected else ""))
            if ratio < min_ratio:
                problems.append(f"all_reduce bus bandwidth {busbw_mbps:.0f} Mb/s is {ratio:.2f} of the link "
                                f"({link:.0f} Mb/s), below {min_ratio}")
        across = f"across {n_hosts} hosts " if n_hosts > 1 else ""
        lines.append(f"all_reduce {allreduce.get('backend')} x{allreduce.get('world_size')} {across}"
                     f"{r['size'] / 2**20:.0f} MiB: {r['time_ms']:.1f} ms, busbw {r['busbw']:.3f} GB/s "
                     f"({busbw_mbps:.0f} Mb/s){verdict}")
    return lines, problems


def verify_summary(hosts: list, hostvars, network: dict, allreduce: dict, min_ratio: float) -> dict:
    pairs = network.get("pairs") or []
    threshold = float(network.get("threshold_mbps") or 0)
    expected = float(network.get("expected_mbps") or 0)
    problems: list[str] = []
    rows = [list(COLUMNS)]
    hosts_out = {}
    for host in hosts:
        h = dict(hostvars[host].get("verify_host") or {})
        net = (network.get("hosts") or {}).get(host) or {}
        out = [p["mbps"] for p in pairs if p["src"] == host]
        into = [p["mbps"] for p in pairs if p["dst"] == host]
        problems += host_problems(host, h, net)
        rows.append(host_row(host, h, net, out, into))
        hosts_out[host] = {**h, "network": net, "out_mbps": min(out) if out else None,
                           "in_mbps": min(into) if into else None}
    problems += [f"{p['src']} -> {p['dst']}: measured {p['mbps']} Mb/s, below the threshold of {threshold:.0f} Mb/s"
                 for p in pairs if threshold and p["mbps"] < threshold]
    differ = versions_differ({h: hosts_out[h].get("venv") or {} for h in hosts if hosts_out[h].get("venv")})
    if differ:
        problems.append("versions differ across hosts: " + "; ".join(differ))
    link = min([p["mbps"] for p in pairs] + ([expected] if expected else [])) if pairs else None
    lines = [_table(rows), "min out/in: each host's slowest measured pair from it / to it (iperf3)"]
    if allreduce:
        more, trouble = allreduce_lines(allreduce, link, len(hosts), min_ratio,
                                        min(p["mbps"] for p in pairs) if pairs else None, expected or None)
        lines += more
        problems += trouble
    lines.append("OK" if not problems else "PROBLEMS:\n- " + "\n- ".join(problems))
    return {"table": "\n".join(lines), "problems": problems, "hosts": hosts_out,
            "network": network, "allreduce": allreduce, "link_mbps": link}


def allreduce_inputs(hosts: list, hostvars, env_stat_var: str, network_inputs: dict, settings: str) -> dict:
    """What the all_reduce's figures depend on, in words a user can compare."""
    out = {f"network {k}": v for k, v in (network_inputs or {}).items()}
    for h in hosts:
        v = hostvars[h]
        venv = (v.get("verify_host") or {}).get("venv") or {}
        env = ((v.get(env_stat_var) or {}).get("stat") or {}).get("checksum", "-")
        ranks = f" cpu_ranks={v['cpu_ranks']}" if v.get("cpu_ranks") not in (None, "", 1, "1") else ""
        out[h] = f"gpus={v.get('gpus', 0)}{ranks} torch={venv.get('torch')} env={env}"
    out["all_reduce"] = settings
    return out


def allreduce_reason(before: dict, inputs: dict, how, max_age_h, now_iso: str) -> str:
    """'' when the all_reduce in verify.json (before) stands, else why it runs again."""
    result = before.get("allreduce") or {}
    passed = bool(result.get("ok")) and not before.get("problems")
    return remeasure.reason(before.get("allreduce_inputs") if result else None, inputs, passed,
                            result.get("timestamp"), remeasure.mode(how), max_age_h, now_iso)


class FilterModule:
    def filters(self):
        return {"verify_summary": verify_summary, "allreduce_inputs": allreduce_inputs,
                "allreduce_reason": allreduce_reason, "intra_allreduce": intra_allreduce,
                "ranks_per_host": ranks_per_host}
