"""The benchmarks on the provisioned lab, against the targets of issue 5.

Rates are capped with tc on the hosts' cluster NIC, ens5 (eth0 on a one-network lab): the lab's
`shape`, or bench-step's own caps.
The step-time sweeps and the all_reduce's bandwidth target (marked `sweep`, about 9 minutes) run in
`make bench-targets`, not in `make test`: benchmarks/README.md records their figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import time

import pytest
import yaml
from labtools import FAB, TOP, as_at_a_terminal, fab, processes, user_without_sudo

from lab import network
from train.cluster import ClusterError, load_hosts
from train.plan import link

BENCH = TOP / "reports" / "bench"
# A model ≥10× tiny's 0.3M parameters: 256 dims, 1024 FFN, 2+2 layers = 3.9M (15.8 MB of fp32 gradients).
BIG = "encoder_embed_dim=256,decoder_embed_dim=256,encoder_ffn_embed_dim=1024,decoder_ffn_embed_dim=1024"



def leftovers(cfg) -> dict[str, str]:
    """Per host: any tbf qdisc (as the controller sees it in the host's namespace, whoever logs in), training
    or benchmark process still there."""
    out = {}
    caps = network.current_caps(cfg)
    for name in cfg.names:
        procs = processes(cfg, name, "fairseq_train|torchrun|train.agent.measure.allreduce|iperf3")
        if caps[name] or procs:
            out[name] = f"tbf {caps[name]}\n" * bool(caps[name]) + procs
    return out


def test_the_caps_and_their_removal_work_as_the_cloud_login_user(provisioned):
    """bench-step's caps on a cloud image's shape: the inventory's user is not root, tc changes the qdisc
    through its passwordless sudo, reads it back without, and the removal leaves no tbf."""
    cfg = provisioned.cfg
    hosts = load_hosts(provisioned.inventory)
    assert {h.user for h in hosts} == {cfg.login_user}
    if cfg.login_user == "root":
        pytest.skip("LAB_LOGIN_USER=root: no sudo to go through")
    link.require_sudo(hosts)
    try:
        link.apply_caps(hosts, "100mbit")
        assert network.current_caps(cfg) == {n: "100Mbit" for n in cfg.names}  # the controller's view
        assert link.caps(hosts) == {n: "100Mbit" for n in cfg.names}  # the login user's (tc is in /sbin)
    finally:
        left = link.remove_caps(hosts)
    assert left == {n: None for n in cfg.names} and network.current_caps(cfg) == left


def test_a_login_user_without_passwordless_sudo_is_named_before_bench_step_touches_anything(data_ready, tmp_path):
    """An inventory whose user may not sudo without a password: bench-step stops at once, naming every host
    and what to do, with no cap set and nothing started."""
    cfg = data_ready.cfg
    with user_without_sudo(cfg) as user:
        hosts = [dataclasses.replace(h, user=user) for h in load_hosts(data_ready.inventory)]
        with pytest.raises(ClusterError) as refused:
            link.apply_caps(hosts, "100mbit")
        said = str(refused.value)
        for name in cfg.names:
            assert f"{name}: tc needs root, and `sudo -n` refused {user} (sudo: a password is required)" in said, said
        assert f"`{user} ALL=(ALL) NOPASSWD:ALL` in a file under /etc/sudoers.d/" in said

        inventory = yaml.safe_load(data_ready.inventory.read_text())
        inventory["all"]["vars"]["ansible_user"] = user
        theirs = dataclasses.replace(data_ready, inventory=tmp_path / "inventory.yml")
        theirs.inventory.write_text(yaml.safe_dump(inventory))
        started = time.monotonic()
        proc = fab(theirs, "bench-step", "--rates", "100mbit,none", check=False)
        took = time.monotonic() - started
    text = " ".join(proc.stdout.split() + proc.stderr.split())
    assert proc.returncode != 0
    assert "capping the link needs root on every host (tc):" in text, text
    assert all(f"{n}: tc needs root, and `sudo -n` refused {user}" in text for n in cfg.names), text
    assert "iperf3" not in proc.stdout and "training" not in proc.stdout  # stopped before measuring anything
    assert not leftovers(cfg)
    print(f"bench-step refused in {took:.1f} s")


# At 100 Mb/s a 64 MB all_reduce already takes ~5 s, so per-message latency is noise; 256 MB would
# take 20 s a round for the same figure. A speed target: a benchmark (`make bench-targets`), not in make test.
@pytest.mark.sweep
@pytest.mark.parametrize(("rate", "size_mb"), [("100mbit", 64), ("1gbit", 256)])
def test_allreduce_busbw_reaches_85_percent_of_iperf3(provisioned, rate, size_mb):
    """The median of three rounds, each iperf3 then the all_reduce right after it (side by side), so a
    moment the 2-core machine is busy elsewhere does not decide; bench-net's --threshold exit follows
    each round's own figure."""
    rounds = []
    provisioned.shape(rate)
    try:
        for _ in range(3):
            proc = fab(provisioned, "bench-net", "--min-size", f"{size_mb}M", "--max-size", f"{size_mb}M",
                       "--iters", "1", "--budget-s", "10", "--threshold", "0.85", check=False)
            report = json.loads((BENCH / "net-latest.json").read_text())
            big = [r for r in report["allreduce"]["results"] if r["size"] >= size_mb * 2**20]
            assert big and report["caps"] and all(report["caps"].values()), proc.stdout + proc.stderr
            assert "busbw(GB/s)" in proc.stdout
            efficiency = min(r["efficiency"] for r in big)
            assert (proc.returncode == 0) == (efficiency >= 0.85), proc.stdout + proc.stderr  # the threshold's exit
            rounds.append((efficiency, report["link_mbps"]))
    finally:
        provisioned.shape("none")
    print(f"{rate}: busbw / iperf3 per round " + ", ".join(f"{e:.0%} of {m} Mbit/s" for e, m in rounds))
    assert statistics.median(e for e, _ in rounds) >= 0.85, rounds


@pytest.fixture(scope="module")
def tiny_sweep(data_ready):
    """The issue's four rates, each met 4 times in one run (about 2.5 min)."""
    fab(data_ready, "bench-step", "--rates", "10mbit,100mbit,1gbit,none", "--updates", "6", "--cycles", "4",
        timeout=900)
    return json.loads((BENCH / "step-latest.json").read_text())


@pytest.fixture(scope="module")
def big_sweep(data_ready, tiny_sweep):
    """13x tiny; 10mbit left out: 13 s an update (about 2.5 min)."""
    fab(data_ready, "bench-step", "--rates", "100mbit,1gbit,none", "--updates", "4", "--cycles", "3", "--set", BIG,
        timeout=900)
    return json.loads((BENCH / "step-latest.json").read_text())


@pytest.fixture(scope="module")
def ddp_sweep(data_ready, big_sweep):
    """13x tiny with pytorch_ddp (the GPU path's DDP, over gloo): its overlap is fitted (about 2.5 min)."""
    fab(data_ready, "bench-step", "--rates", "100mbit,1gbit,none", "--updates", "4", "--cycles", "3", "--set",
        f"{BIG},ddp_backend=pytorch_ddp", timeout=900)
    return json.loads((BENCH / "step-latest.json").read_text())


def check_sweep(report):
    """Every capped rate predicted within ±15%: the median over the sweep's cycles (repeats measured side
    by side, the rates interleaved), so one cycle a noisy 2-core machine slowed does not decide."""
    assert report["compute_from"] == "none"  # C: the uncapped step less its own all-reduce
    for p in report["points"]:
        assert p["devices"] == 2, p  # both ranks took part
        if p["rate"] == "none":
            continue  # predicted = measured there by construction
        errors = [p["predicted_s"] / s - 1 for s in p["cycle_s"]]
        print(f"{report['preset']} {p['rate']}: predicted {p['predicted_s']:.3f} s/update, measured per cycle "
              + ", ".join(f"{s:.3f}" for s in p["cycle_s"]) + f" (errors {', '.join(f'{e:+.0%}' for e in errors)})")
        assert len(errors) == report["cycles"]
        assert abs(statistics.median(errors)) <= 0.15, (
            f"{p['rate']}: predicted {p['predicted_s']:.3f}, measured per cycle {p['cycle_s']}")
        # the NIC really carried the all-reduce: at least the model's 2(n-1)/n x S per update
        assert p["tx_per_update"] >= 0.8 * p["model_tx_bytes"], p  # counters read between polls: ±10%
    assert (BENCH / f"step-{report['timestamp'][:19].replace('-', '').replace(':', '').replace('T', '-')}.png").exists()


@pytest.mark.sweep
def test_tiny_predicted_within_15_percent(tiny_sweep, provisioned):
    check_sweep(tiny_sweep)
    assert not leftovers(provisioned.cfg)


@pytest.mark.sweep
def test_10x_model_predicted_within_15_percent(big_sweep, tiny_sweep, provisioned):
    assert big_sweep["params"] >= 10 * tiny_sweep["params"]
    check_sweep(big_sweep)
    assert not leftovers(provisioned.cfg)


@pytest.mark.sweep
def test_pytorch_ddp_overlap_fitted_and_each_rate_predicted_from_the_others(ddp_sweep, big_sweep, provisioned):
    assert ddp_sweep["ddp_backend"] == "pytorch_ddp" and big_sweep["ddp_backend"] == "legacy_ddp"
    assert big_sweep["overlap"] == 0.0
    print(f"pytorch_ddp overlap {ddp_sweep['overlap']:.2f}; per rate, fitted without it: "
          + ", ".join(f"{p['rate']} {p['overlap_used']:.2f}" for p in ddp_sweep["points"]))
    check_sweep(ddp_sweep)  # each capped rate's prediction uses the overlap fitted to the other rate
    assert not leftovers(provisioned.cfg)


def test_100mbit_cap_is_network_bound_and_train_refuses(data_ready):
    """The field report: Transformer base (here with the lab's 1k vocabulary, 44M parameters) on a port
    capped at 100 Mb/s when the inventory expects 1 Gb/s."""
    data_ready.shape("100mbit")
    try:
        # no compute figure for base on the lab: the verdict comes from the link against the expected 1 Gb/s
        plain = fab(data_ready, "predict", "--preset", "transformer_wmt_en_de", check=False)
        # the field report's run: its V100 step (1.8 s) as compute-only, one batch an update (its batch of
        # 128-256 sentences a GPU, no accumulation); the full prediction, as JSON
        full = fab(data_ready, "predict", "--preset", "transformer_wmt_en_de", "--compute-s", "1.8",
                   "--update-freq", "1", "--json", check=False)
        # last and best only: the preset's 9 files of base (7.2 GB) do not fit the lab's 3.9 GB /data, and
        # the disk preflight would refuse first
        train = fab(data_ready, "train", "--new", "--detach", "--preset", "transformer_wmt_en_de", "--set",
                    "keep_best_checkpoints=0,save_interval_updates=0", check=False)
    finally:
        data_ready.shape("none")
    assert plain.returncode == 3, plain.stdout + plain.stderr
    assert "NETWORK-BOUND" in plain.stdout and "expects 1000 Mbit/s" in plain.stdout
    figures = json.loads(full.stdout)
    assert full.returncode == 3 and figures["network_bound"]
    assert figures["prediction"]["comm_share"] > 0.8 and figures["prediction"]["update_freq_for_90"] > 1
    assert figures["at_expected"]["step_s"] < figures["prediction"]["step_s"] / 3
    assert train.returncode != 0
    assert "nothing started" in train.stdout and "--accept-slow-network" in train.stdout
    assert "s per update" in train.stdout  # the numbers are shown
    assert not leftovers(data_ready.cfg)


def test_interrupted_bench_step_leaves_no_cap_and_no_process(data_ready):
    env = {**os.environ, "FABRIC_INVENTORY": str(data_ready.inventory), "COLUMNS": "200"}
    proc = subprocess.Popen([FAB, "bench-step", "--rates", "100mbit,none", "--updates", "500"], cwd=TOP, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=as_at_a_terminal)
    out = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            out.append(line)
            if "the cap changes under it" in line or time.monotonic() > deadline:
                break
        time.sleep(15)  # half-way: the cap is on, both ranks train
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        out.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            data_ready.shape("none")
    text = "".join(out)
    assert proc.returncode != 0
    assert "cap removed on v100a, v100b" in text, text
    assert "stopped bench-" in text, text
    assert not leftovers(data_ready.cfg)


def test_a_killed_controller_mid_bench_step_leaves_no_cap_and_no_rank_within_two_minutes(data_ready):
    """The controller's `fab` dies mid-sweep (SIGKILL: no `finally`; or a laptop asleep, offline): each
    host's lease (train.agent.measure.lease) is no longer renewed, and after its minute the host stops the
    benchmark's ranks and removes the cap by itself."""
    env = {**os.environ, "FABRIC_INVENTORY": str(data_ready.inventory), "COLUMNS": "200"}
    proc = subprocess.Popen([FAB, "bench-step", "--rates", "100mbit,none", "--updates", "500"], cwd=TOP, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            if "the cap changes under it" in line or time.monotonic() > deadline:
                break
        time.sleep(10)  # the cap is on, both ranks train
        assert leftovers(data_ready.cfg), "nothing to leave behind: the sweep did not start"
        proc.kill()  # by the PID this test started
        proc.wait()
        killed = time.monotonic()
        while leftovers(data_ready.cfg) and time.monotonic() - killed < 120:
            time.sleep(3)
        took, left = time.monotonic() - killed, leftovers(data_ready.cfg)
    finally:
        if proc.poll() is None:
            proc.kill()
        if leftovers(data_ready.cfg):
            data_ready.shape("none")
            fab(data_ready, "stop", check=False)
    assert not left, left
    print(f"controller killed mid-bench-step: no rank and no cap left {took:.0f} s later (lease of 60 s)")
