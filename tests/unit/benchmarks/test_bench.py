"""The benchmarks' pure parts: table formatting, busbw and efficiency, the step sweep's figures and
predictions; and what `fab bench-net` and `fab bench-step` do with their options and the hosts' answers.
(The cost model, the link and the records they write: tests/unit/train/plan.)"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import net, step
from train.agent.measure import allreduce
from train.cluster import ClusterError, GroupResult, Host, HostResult
from train.plan import link, measurements, model
from train.recipe import strategies
from train.recipe.logformat import logged_params, parse_log


def row(size: int, time_ms: float, ranks: int = 2) -> dict:
    algbw = size / (time_ms / 1e3) / 1e9
    return {"size": size, "count": size // 4, "type": "float", "time_ms": time_ms, "algbw": algbw,
            "busbw": algbw * allreduce.bus_factor(ranks), "correct": True}


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert allreduce.bus_factor(2) == 1.0
    assert allreduce.bus_factor(4) == 1.5
    assert allreduce.bus_factor(8) == pytest.approx(1.75)


def test_sweep_sizes_are_powers_of_two_between_the_bounds():
    sizes = allreduce.sizes_between(allreduce.parse_size("1M"), allreduce.parse_size("1G"))
    assert sizes[0] == 2**20 and sizes[-1] == 2**30 and len(sizes) == 11
    assert allreduce.sizes_between(3 * 2**20, 2**23) == [2**21, 2**22, 2**23]
    with pytest.raises(ValueError):
        allreduce.sizes_between(2**20, 2**10)


def test_slow_sizes_get_fewer_iterations_and_no_warmup():
    assert allreduce.plan(5, 1, None, 20) == (5, 1)  # the first size: nothing to estimate from
    assert allreduce.plan(5, 1, 0.1, 20) == (5, 1)
    assert allreduce.plan(5, 1, 8.0, 20) == (2, 0)
    assert allreduce.plan(5, 1, 80.0, 20) == (1, 0)  # 1 GB at 100 Mb/s: one iteration
    assert allreduce.plan(5, 1, 80.0, None) == (5, 1)  # no budget: as asked (the verify role)


def test_efficiency_is_busbw_over_the_measured_link():
    # 256 MiB in 2.25 s on 2 ranks = 119 MB/s busbw; iperf3 measured 957 Mbit/s = 119.6 MB/s
    rows = net.with_efficiency([row(2**28, 2250.0)], link_mbps=957.0)
    assert rows[0]["efficiency"] == pytest.approx(2**28 / 2.25 * 8 / 957e6)
    assert net.with_efficiency([row(2**28, 2250.0)], None)[0]["efficiency"] is None


def test_table_has_nccl_tests_columns_with_units():
    text = net.table(net.with_efficiency([row(2**20, 10.0), row(2**28, 2250.0)], 957.0))
    header, first, second = text.splitlines()
    assert header.split() == ["size(B)", "count", "type", "time(ms)", "algbw(GB/s)", "busbw(GB/s)", "busbw/link"]
    assert first.split()[0] == "1048576" and first.split()[3] == "10.00"
    assert second.split()[-1] == "100%"


def test_threshold_checks_256MB_and_above():
    rows = net.with_efficiency([row(2**20, 100.0), row(2**28, 2250.0), row(2**29, 6000.0)], 957.0)
    ok, reasons = net.verdict(rows, 0.85)
    assert not ok and len(reasons) == 1 and reasons[0].startswith("536870912 B")  # 1 MB is not held against it
    assert net.verdict(rows[:2], 0.85) == (True, [])
    assert net.verdict(rows, None) == (True, [])
    small = net.with_efficiency([row(2**20, 100.0)], 957.0)  # a sweep cut below 256 MB: its largest size
    assert not net.verdict(small, 0.85)[0]


def test_rates_are_tc_rates():
    assert step.parse_rates("10mbit, none") == ["10mbit", "none"]
    with pytest.raises(ValueError, match="not a tc rate"):
        step.parse_rates("10mbit,fast")
    with pytest.raises(ValueError, match="no rates given"):
        step.parse_rates(" , ")


LOG = """\
2026-11-22 08:00:00 | INFO | fairseq_cli.train | num. shared model params: 298,560 (num. trained: 298,560)
2026-11-22 08:00:01 | INFO | fairseq_cli.train | training on 2 devices (GPUs/TPUs)
""" + "".join(
    f'2026-11-22 08:00:{i + 2:02d} | INFO | train_inner | {{"epoch": 1, "loss": "9.0", "wps": "{w}", '
    f'"ups": "1", "wpb": "2000", "num_updates": "{i + 1}", "wall": "{i}"}}\n'
    for i, w in enumerate([500, 1000, 1500, 4000, 5000, 4000, 4000, 2000])
)


def test_each_rate_takes_the_median_of_its_segments_updates():
    updates = step.per_update(parse_log(LOG.splitlines()).records)
    assert updates[1]["s"] == pytest.approx(4.0)  # 2000 words / 500 wps
    segments = [{"rate": "10mbit", "first": 1, "last": 3, "tx": {"a": 3_000_000, "b": 3_200_000}},
                {"rate": "none", "first": 4, "last": 6, "tx": {"a": 3_000_000, "b": 3_000_000}},
                {"rate": "10mbit", "first": 7, "last": 8, "tx": {"a": 2_000_000, "b": 2_000_000}}]
    ten, none = step.summarize(["10mbit", "none", "10mbit"], segments, updates, {"10mbit": 9.6, "none": 9000.0})
    assert ten["segments"] == 2 and ten["updates_measured"] == 5
    assert ten["s_per_update"] == pytest.approx(4 / 3)  # of 4, 2, 1.33, 0.5, 1.0
    assert ten["cycle_s"] == pytest.approx([2.0, 0.75])  # each repeat alone: of 4, 2, 1.33 and of 0.5, 1.0
    assert ten["tx_per_update"] == pytest.approx((5_000_000 + 5_200_000) / 2 / 5)
    assert none["s_per_update"] == pytest.approx(0.5) and none["link_mbps"] == 9000.0
    assert logged_params(LOG) == 298560


def points() -> list[dict]:
    return [{"rate": "100mbit", "link_mbps": 95.0, "s_per_update": 0.30, "wps": 6000, "tx_per_update": 1.3e6},
            {"rate": "none", "link_mbps": 10000.0, "s_per_update": 0.20, "wps": 9000, "tx_per_update": 1.3e6}]


def test_predictions_use_the_uncapped_run_as_compute_only():
    pts = points()
    c, source, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    assert c == pytest.approx(0.20 - 1.2e6 / 1.25e9) and source == "none"
    assert pts[1]["predicted_s"] == pytest.approx(0.20)
    assert pts[0]["predicted_s"] == pytest.approx(c + 1.2e6 / (95e6 / 8))
    assert pts[0]["model_tx_bytes"] == 1.2e6
    text = step.table(pts)
    assert text.splitlines()[0].split()[:5] == ["rate", "link(Mbit/s)", "allreduce(Mbit/s)", "s/update", "predicted"]
    capped, uncapped = text.splitlines()[1].split(), text.splitlines()[2].split()
    assert capped[5] == f"{pts[0]['error']:+.0%}" and uncapped[5] == "(C)"  # C's own rate: no error to show


def test_two_hosts_of_two_ranks_send_one_and_a_half_gradients_per_update_on_each_nic():
    """A ring over 4 ranks numbered host by host crosses each host's NIC once: 2(n-1)/n = 1.5 x S per NIC
    per update, what bench-step's tx_per_update (the NIC's own counter) is checked against."""
    pts = points()
    c, _, _ = step.with_predictions(pts, params=300_000, ranks=4, hosts=2)
    assert pts[0]["model_tx_bytes"] == pytest.approx(1.8e6)  # 1.5 x 1.2 MB of fp32 gradients
    assert pts[0]["predicted_s"] == pytest.approx(c + 1.8e6 / (95e6 / 8))


def test_the_gradients_own_all_reduce_rate_wins_over_iperf3():
    pts = points()
    pts[0]["allreduce_mbps"] = 50.0  # short transfers through the cap: half of iperf3's steady state
    c, _, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    assert pts[0]["predicted_s"] == pytest.approx(c + 1.2e6 / (50e6 / 8))


def test_plot_is_a_png(tmp_path):
    pts = points()
    c, _, _ = step.with_predictions(pts, params=300_000, ranks=2, hosts=2)
    report = {"points": pts, "params": 300_000, "ranks": 2, "n_hosts": 2, "compute_s": c, "preset": "tiny"}
    step.plot(report, tmp_path / "step.png")
    assert (tmp_path / "step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_step_refuses_half_precision_on_cpu_hosts_before_touching_them():
    cpu = [Host("v100a", "10.0.0.1"), Host("v100b", "10.0.0.2")]  # unreachable: nothing may be tried
    with pytest.raises(ClusterError, match="bf16 needs GPUs; v100a, v100b have none"):
        step.bench_step(cpu, ["none"], precision="bf16")


def overlapped_points(c: float, overlap: float, mbit_rates: list[float], params: int = 4_000_000) -> list[dict]:
    """Step times a DDP that hides `overlap` × C of the all-reduce would show (2 hosts, fp32)."""
    out = []
    for mbit in mbit_rates:
        comm = model.allreduce_bytes_per_rank(model.gradient_bytes(params), 2) / model.mbit_to_bytes_per_s(mbit)
        out.append({"rate": f"{mbit:g}mbit" if mbit < 10_000 else "none", "link_mbps": mbit,
                    "s_per_update": c + max(0.0, comm - overlap * c)})
    return out


def test_pytorch_ddp_overlap_is_fitted_and_each_rate_predicted_from_the_others():
    pts = overlapped_points(0.8, 0.4, [100, 300, 1000, 20_000])
    c, source, overlap = step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="pytorch_ddp")
    assert source == "none" and overlap == pytest.approx(0.4, abs=0.01) and c == pytest.approx(0.8, rel=0.01)
    for p in pts:
        assert p["error"] == pytest.approx(0, abs=0.02), p
        if p["rate"] != "none":
            assert p["overlap_used"] == pytest.approx(0.4, abs=0.01)  # fitted without this rate


def test_at_the_derived_update_freq_c_is_one_batch_and_the_summary_says_the_batch():
    """bench-step trains at the batch fab train derives (here 4 batches an update): C is one batch's, as
    fab predict and fab train's check use it (K x C + the all-reduce's exposed part)."""
    k, c, overlap = 4, 0.2, 0.4
    pts = overlapped_points(c, overlap, [100, 300, 1000, 20_000])
    for p in pts:  # the other K - 1 batches of each update: K x C + max(0, comm - overlap x C)
        p["s_per_update"] += (k - 1) * c
    got, source, fitted = step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="pytorch_ddp",
                                                update_freq=k)
    assert got == pytest.approx(c, rel=0.01) and fitted == pytest.approx(overlap, abs=0.01)
    assert all(p["error"] == pytest.approx(0, abs=0.02) for p in pts)
    report = {"preset": "tiny", "params": 4_000_000, "gradient_bytes": 16_000_000, "ranks": 2, "compute_s": got,
              "compute_from": source, "max_tokens": 3584, "update_freq": k, "points": pts, "path": "x.json",
              "plot": "x.png"}
    assert f"compute-only C {got:.3f} s a batch of 3,584 tokens a rank x update-freq 4 = {k * got:.3f} s/update" \
        in step.summary(report)


def test_legacy_ddp_keeps_overlap_zero_even_when_a_fit_would_flatter_it():
    pts = overlapped_points(0.8, 0.4, [100, 1000, 20_000])
    _, _, overlap = step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="legacy_ddp")
    assert overlap == 0.0 and all(p["overlap_used"] == 0.0 for p in pts)
    assert pts[0]["error"] > 0.05  # the same steps read as legacy_ddp: the model (rightly) over-predicts


def test_one_capped_rate_alone_is_marked_as_fitted_not_checked():
    pts = overlapped_points(0.8, 0.4, [100, 20_000])
    step.with_predictions(pts, params=4_000_000, ranks=2, hosts=2, backend="pytorch_ddp")
    assert pts[0]["fitted_on_itself"] and step.table(pts).splitlines()[1].split()[5] == "(fit)"


def answers(**outcomes) -> GroupResult:
    """What run_all / run_each / on_each return: {host: HostResult}; an exception stands for a host
    SSH could not reach, text for a command that printed it and exited 0."""
    return GroupResult((name, HostResult(name, error=o) if isinstance(o, Exception) else
                        HostResult(name, stdout=o, exited=0)) for name, o in outcomes.items())


def two_hosts(gpus: int = 0) -> list[Host]:
    return [Host("v100a", "10.0.0.1", gpus=gpus, nic="eth1"), Host("v100b", "10.0.0.2", gpus=gpus, nic="eth1")]


def test_an_all_reduce_that_cannot_start_names_the_host_and_why_and_stops_the_others(monkeypatch):
    ran = []
    monkeypatch.setattr(net, "run_each", lambda hosts, commands: answers(v100a="", v100b=OSError("no route to host")))
    monkeypatch.setattr(net, "run_all", lambda hosts, command: ran.append(command) or answers(v100a="", v100b=""))
    with pytest.raises(ClusterError, match=r"could not start all_reduce on every host:\n  v100b: unreachable "
                                           r"\(no route to host\)"):
        net.run_allreduce(two_hosts(), "1M")
    assert ran == [net.KILL]  # every job stopped, also on the way out


def test_bench_step_asks_every_hosts_sudo_before_it_measures_or_starts_anything(monkeypatch):
    """A cloud image's login user changes the qdisc through `sudo -n`: where sudo would ask a password, bench-step
    stops before its first iperf3, naming the host and what to do."""
    cloud = [replace(h, user="debian") for h in two_hosts()]
    measured = []
    monkeypatch.setattr(step, "measure_links", lambda *a, **kw: measured.append(a))
    monkeypatch.setattr(step, "dataset_vocab", lambda *a: 1000)
    monkeypatch.setattr(link, "run_each", lambda hosts, commands: GroupResult(
        (h.name, HostResult(h.name, stderr="sudo: a password is required", exited=1)) for h in hosts))
    with pytest.raises(ClusterError, match=r"capping the link needs root on every host \(tc\):\n  v100a: tc needs "
                                           r"root, and `sudo -n` refused debian \(sudo: a password is required\)"):
        step.bench_step(cloud, ["100mbit", "none"])
    assert measured == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root, to be another user too")
def test_the_all_reduce_job_of_a_login_user_is_not_stopped_by_another_users_files():
    """Each login user's all_reduce files in a directory of its own: one that root (or a colleague) left in a
    shared /tmp/tandem-bench is not writable by a cloud image's user, and bench-net could not start there."""
    start = net.allreduce_commands(two_hosts(), "1M", 1, 0, 5, 29501, 60)["v100a"].split(" && ")[:2]
    prepare = " && ".join(start) + " && echo started > allreduce.out && cat allreduce.out"
    mine = subprocess.run(["sh", "-c", "echo " + net.REMOTE_DIR], capture_output=True, text=True).stdout.strip()
    theirs = mine.rsplit("-", 1)[0] + "-nobody"
    try:
        assert subprocess.run(["sh", "-c", prepare], capture_output=True, text=True, cwd="/").stdout == "started\n"
        as_user = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", prepare], capture_output=True,
                                 text=True, cwd="/")
        assert as_user.returncode == 0 and as_user.stdout == "started\n", as_user.stderr
    finally:
        for path in (mine, theirs):
            shutil.rmtree(path, ignore_errors=True)


def test_nic_counters_a_host_did_not_give_are_named(monkeypatch):
    monkeypatch.setattr(step, "run_each", lambda hosts, commands: answers(v100a="1000\n", v100b=OSError("gone")))
    with pytest.raises(ClusterError, match="could not read the NIC counters on v100b"):
        step.tx_bytes(two_hosts())
    monkeypatch.setattr(step, "run_each", lambda hosts, commands: answers(v100a="1000\n", v100b="2000\n"))
    assert step.tx_bytes(two_hosts()) == {"v100a": 1000, "v100b": 2000}


def test_bench_net_says_where_its_json_is_then_fails_below_the_threshold(monkeypatch):
    asked, said = {}, []
    report = {"path": "reports/bench/net-x.json", "ok": False, "problems": ["268435456 B: busbw 700 Mbit/s ..."]}
    monkeypatch.setattr(net, "bench_net", lambda hosts, **kw: asked.update(kw) or report)
    with pytest.raises(ClusterError, match=r"below the threshold:\n  268435456 B"):
        net.run(two_hosts(), iters="3", budget_s="10", threshold="0.85", port="29511", say=said.append)
    assert said == ["JSON reports/bench/net-x.json"]
    assert (asked["iters"], asked["budget_s"], asked["threshold"], asked["port"]) == (3, 10.0, 0.85, 29511)


def test_bench_step_trains_as_fab_train_would(monkeypatch):
    """fab bench-step's options: the precision fab train picks (fp16 on GPU hosts), --set split between
    overrides and not inside a value, one job per strategy."""
    jobs = []
    monkeypatch.setattr(step, "bench_step", lambda hosts, rates, **kw: jobs.append((rates, kw)) or {})
    monkeypatch.setattr(step, "summary", lambda report: "summary")
    step.run(two_hosts(gpus=1), rates="100mbit,none", set_text="adam_betas=(0.9, 0.98),lr=0.001", updates="4",
             say=lambda *_: None)
    (rates, kw), = jobs
    assert rates == ["100mbit", "none"] and kw["precision"] == "fp16" and kw["updates"] == 4
    assert kw["overrides"] == ["adam_betas=(0.9, 0.98)", "lr=0.001"] and kw["comm"] == "sync"
    jobs.clear()
    step.run(two_hosts(), rates="none", say=lambda *_: None)
    assert jobs[0][1]["precision"] == "fp32"  # a CPU host: fp32, as fab train
    with pytest.raises(ClusterError, match="not a tc rate"):
        step.run(two_hosts(), rates="fast")


def test_bench_step_compares_several_strategies_side_by_side_with_a_plot(monkeypatch, tmp_path):
    def report(comm, capped_s, own_s):
        return {"comm": comm, "timestamp": "2026-11-22T08:00:00+00:00", "preset": "tiny", "params": 300_000,
                "ranks": 2, "n_hosts": 2, "compute_s": 0.2, "precision": "fp32",
                "points": [{"rate": "100mbit", "link_mbps": 95.0, "s_per_update": capped_s},
                           {"rate": "none", "link_mbps": 9000.0, "s_per_update": own_s}]}

    timings = {"sync": (0.5, 0.2), "local-sgd:8": (0.25, 0.2)}
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    monkeypatch.setattr(step, "bench_step", lambda hosts, rates, comm, **kw: report(comm, *timings[comm]))
    monkeypatch.setattr(step, "summary", lambda report: f"summary {report['comm']}")
    said = []
    reports = step.run(two_hosts(), rates="100mbit,none", comm="sync,local-sgd:8", say=said.append)
    assert [r["comm"] for r in reports] == ["sync", "local-sgd:8"]
    assert said[:2] == ["summary sync", "summary local-sgd:8"]
    assert "of sync uncapped" in said[2] and said[3] == f"plot {tmp_path}/step-compare-2026-11-22T080000+0000.png"
    assert (tmp_path / "step-compare-2026-11-22T080000+0000.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ClusterError, match=re.escape(f"--comm is {strategies.syntax()} or auto")):
        step.run(two_hosts(), rates="none", comm="gossip")


@pytest.mark.parametrize(("args", "said"), [
    (["bench-step", "--rates", "10mbit,fast"], "rate 'fast' is not a tc rate like 10mbit"),
    (["bench-step", "--comm", "sync,gossip"], f"--comm is {strategies.syntax()} or auto, not 'gossip'"),
    (["bench-quality", "--comm", "sync,auto"], "bench-quality measures named ones"),
    (["bench-quality", "--set", "max_update=5,adam_betas=(0.9, 0.98)"], "--set max_update=5: bench-quality sets"),
    (["predict", "--comm", "gossip"], f"--comm is {strategies.syntax()} or auto, not 'gossip'"),
    (["bench-net", "--nccl-sockets", "9x8"], "NCCL sockets 9x8: threads 1 to 16, threads x sockets per thread at most"),
])
def test_the_fab_tasks_are_the_benchmarks_door_and_refuse_a_bad_option_before_touching_a_host(args, said):
    """inventory/hosts.yml's hosts do not exist (TEST-NET addresses): a task that tried one would hang
    on it, then fail differently."""
    top = Path(__file__).resolve().parents[3]
    env = {**os.environ, "FABRIC_INVENTORY": "inventory/hosts.yml", "COLUMNS": "400"}
    proc = subprocess.run([str(Path(sys.executable).parent / "fab"), *args], cwd=top, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and said in proc.stdout + proc.stderr, proc.stdout + proc.stderr  # bad input



def launched_ranks(job: str) -> list[str]:
    """What a host's bench-net job becomes on the host: its launcher line, parsed as the launcher parses it,
    turned into the ranks' command (train.agent.measure.allreduce.launch, without the exec)."""
    argv = shlex.split(job.split("setsid nohup ", 1)[1].split(" > ", 1)[0])
    assert argv[1:3] == ["-m", "train.agent.measure.allreduce"], argv
    return allreduce.ranks_command(allreduce.parser().parse_args(argv[3:]), argv[0])


def test_gpu_hosts_all_reduce_through_nccl_under_torchrun_with_provisionings_environment():
    """2 hosts x 8 GPUs: each host's launcher reads /etc/tandem/env (the NIC and NCCL's sockets provisioning
    wrote), takes --nccl-sockets over it, and starts torchrun with one NCCL worker per GPU; the lab's CPU hosts
    keep gloo, one rank each, no torchrun."""
    gpus = two_hosts(gpus=8)
    jobs = net.allreduce_commands(gpus, "1M..1G", 5, 1, 20, 29501, 1800, backend=net.backend_for(gpus),
                                  nccl_sockets="4x4")
    launcher = shlex.split(jobs["v100b"].split("setsid nohup ", 1)[1].split(" > ", 1)[0])
    assert launcher[:11] == ["/opt/tandem/venv/bin/python", "-m", "train.agent.measure.allreduce", "--node-rank", "1",
                             "--ranks-per-host", "8,8", "--master-addr", "10.0.0.1", "--master-port", "29501"]
    for flag, value in (("--env-file", "/etc/tandem/env"), ("--backend", "nccl"), ("--nccl-sockets", "4x4")):
        assert launcher[launcher.index(flag) + 1] == value
    ranks = launched_ranks(jobs["v100b"])
    assert ranks[:10] == ["/opt/tandem/venv/bin/torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node",
                          "8", "--master_addr", "10.0.0.1", "--master_port"]
    assert ranks[ranks.index("--backend") + 1] == "nccl" and ranks[ranks.index("--max-size") + 1] == "1G"
    assert "--nccl-sockets" not in ranks  # the launcher set the environment; the ranks inherit it

    cpu = two_hosts()
    lab = launched_ranks(net.allreduce_commands(cpu, "1M..256M", 5, 1, 20, 29501, 1800,
                                                backend=net.backend_for(cpu))["v100a"])
    assert lab[:3] == ["/opt/tandem/venv/bin/python", "-m", "train.agent.measure.allreduce"]
    assert lab[lab.index("--backend") + 1] == "gloo"
    assert net.backend_for([*two_hosts(gpus=8)[:1], *cpu[1:]]) == "gloo"  # NCCL needs a GPU for every rank


def test_nccls_busbw_is_said_in_gbit_s_beside_iperf3s():
    """2 hosts x 2 GPUs, 1 GiB in 800 ms: busbw = 2(4-1)/4 x 1 GiB / 0.8 s = 2.013 GB/s = 16.11 Gbit/s, 69% of
    iperf3's 23.5 Gbit/s."""
    rows = net.with_efficiency([row(2**20, 1.0, ranks=4), row(2**30, 800.0, ranks=4)], 23_500.0)
    assert rows[-1]["busbw"] == pytest.approx(1.5 * 2**30 / 0.8 / 1e9)
    line = net.versus_iperf3(rows, 23_500.0, "nccl", {"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8"},
                             16, [])
    assert line == ("NCCL busbw 16.11 Gbit/s at 1 GiB (2x8 sockets) vs iperf3 23.50 Gbit/s (slowest pair, "
                    "16 streams), 69%")
    assert "(NCCL's defaults)" in net.versus_iperf3(rows, 900.0, "nccl", {"NCCL_SOCKET_IFNAME": "ens5"}, 1, [])
    lab = net.versus_iperf3(net.with_efficiency([row(2**28, 22_500.0)], 95.6), 95.6, "gloo", {}, 1, ["v100a", "v100b"])
    assert lab == ("NCCL not measured: v100a, v100b have no GPU (gloo's busbw at 256 MiB: 0.10 Gbit/s; iperf3 "
                   "0.10 Gbit/s, 100%)")


def test_bench_net_on_gpu_hosts_reports_nccl_beside_iperf3(monkeypatch, tmp_path):
    """The hosts and their GPUs stand in (no GPU here): what bench-net asks of the all_reduce and what it says."""
    hosts = [replace(h, vars={"network_expected_mbps": 100_000}) for h in two_hosts(gpus=8)]
    asked, said = {}, []
    monkeypatch.setattr(net, "host_info", lambda hosts: {h.name: {"iperf3": "iperf 3.16"} for h in hosts})
    monkeypatch.setattr(link, "caps", lambda hosts: {h.name: None for h in hosts})
    monkeypatch.setattr(link, "iperf", lambda hosts, pattern, seconds: (
        [link.Pair("v100a", "v100b", 94_100.0, 0), link.Pair("v100b", "v100a", 93_800.0, 0)], {}))
    nccl_env = {"NCCL_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "8"}

    def allreduce_on_gpus(hosts, sizes, **kw):
        asked.update(kw, sizes=sizes)
        return {"backend": "nccl", "world_size": 16, "nccl_env": nccl_env, "torch": "2.9.1", "cuda": "12.8",
                "device": "NVIDIA H100 80GB HBM3", "results": [row(2**30, 200.0, ranks=16)]}

    monkeypatch.setattr(net, "run_allreduce", allreduce_on_gpus)
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path)
    report = net.bench_net(hosts, say=said.append)
    assert (asked["backend"], asked["nccl_sockets"], asked["sizes"]) == ("nccl", None, "1M..1G")
    # 16 ranks, 1 GiB in 200 ms: 2(16-1)/16 x 1 GiB / 0.2 s = 10.07 GB/s = 80.53 Gbit/s
    assert said[-1] == ("NCCL busbw 80.53 Gbit/s at 1 GiB (2x8 sockets) vs iperf3 93.80 Gbit/s (slowest pair, "
                        "16 streams), 86%")
    assert report["nccl"] == {"measured": True, "settings": nccl_env, "busbw_gbps": pytest.approx(80.53, abs=0.01),
                              "iperf3_gbps": 93.8, "iperf3_streams": 16}


def test_the_nccl_line_names_the_streams_the_slowest_pair_was_measured_with():
    """Hosts of two link speeds: iperf3's figure is the slowest pair's, measured with its sender's streams."""
    fast, slow = (replace(h, vars={"network_expected_mbps": mbps}) for h, mbps in zip(two_hosts(gpus=8),
                                                                                    (100_000, 5_000), strict=True))
    pairs = [link.Pair("v100a", "v100b", 94_100.0, 0), link.Pair("v100b", "v100a", 4_700.0, 0)]
    assert net.slowest_pair_streams(pairs, [fast, slow]) == 1  # v100b's 5 Gb/s: one stream
    assert net.slowest_pair_streams(list(reversed(pairs))[:1] + [replace(pairs[0], mbps=None)], [fast, slow]) == 1
    assert net.slowest_pair_streams([replace(pairs[1], mbps=None)], [fast, slow]) == 16  # none measured: hosts[0]'s
