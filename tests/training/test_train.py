"""`fab train` on the provisioned lab, for real: CPU, gloo, the tiny preset, synthetic data."""

from __future__ import annotations

import json
import re
import time

import pytest
from labtools import TOP, fab, ssh

RUNS = "/data/tandem/runs"




def training_processes(cfg, name: str) -> list[str]:
    out = ssh(cfg, name, "pgrep -af 'fairseq-train|torchrun' || true").stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def log_of(cfg, name: str, run_id: str) -> str:
    return ssh(cfg, name, f"cat {RUNS}/{run_id}/train.log").stdout


def inner_records(log: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", log)]


def latest_run_id() -> str:
    return json.loads((TOP / "reports" / "latest" / "run.json").read_text())["run_id"]


def wait_for_update(cfg, run_id: str, update: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = inner_records(log_of(cfg, cfg.names[0], run_id))
        if records and int(records[-1]["num_updates"]) >= update:
            return
        time.sleep(2)
    raise AssertionError(f"{run_id} did not reach update {update} in {timeout} s")


@pytest.fixture(scope="module")
def data_ready(provisioned):
    out = fab(provisioned, "prepare-data").stdout
    assert "identical on every host" in out
    return provisioned


@pytest.fixture(scope="module")
def one_host_run(data_ready):
    """The same model on one host for a few updates: the baseline for tokens per batch, and an
    (almost) untrained model for BLEU."""
    fab(data_ready, "--hosts", "v100a", "train", "--new", "--set",
        "max_update=3,save_interval_updates=3,log_interval=1")
    run_id = latest_run_id()
    out = fab(data_ready, "--hosts", "v100a", "evaluate", "--checkpoint", "checkpoint_last.pt").stdout
    return run_id, float(re.search(r"SacreBLEU ([0-9.]+)", out).group(1))


@pytest.fixture(scope="module")
def two_host_run(data_ready, one_host_run):
    out = fab(data_ready, "train", "--new", "--set", "max_update=60").stdout
    return latest_run_id(), out


def test_both_ranks_train_together(data_ready, two_host_run, one_host_run):
    cfg = data_ready.cfg
    run_id, out = two_host_run
    log = log_of(cfg, "v100a", run_id)
    assert "training on 2 devices" in log
    assert "60/60" in out
    updates = [int(r["num_updates"]) for r in inner_records(log)]
    assert updates[-1] >= 50
    two = sum(float(r["wpb"]) for r in inner_records(log)) / len(inner_records(log))
    one = inner_records(log_of(cfg, "v100a", one_host_run[0]))
    assert one, "the one-host run logged no train_inner line"
    one_wpb = sum(float(r["wpb"]) for r in one) / len(one)
    assert 1.6 < two / one_wpb < 2.4, (two, one_wpb)  # tokens per batch double with a second host
    listing = ssh(cfg, "v100a", f"ls {RUNS}/{run_id}/checkpoints").stdout.split()
    assert "checkpoint_last.pt" in listing and "checkpoint_best.pt" in listing
    # the off-host copy: the last checkpoint also lives on v100b and on the controller
    assert ssh(cfg, "v100b", f"test -s {RUNS}/{run_id}/checkpoints/checkpoint_last.pt").returncode == 0
    assert (TOP / "reports" / run_id / "checkpoints" / "checkpoint_last.pt").exists()
    assert training_processes(cfg, "v100a") == [] and training_processes(cfg, "v100b") == []


def test_evaluate_scores_the_trained_model_above_an_untrained_one(data_ready, two_host_run, one_host_run):
    out = fab(data_ready, "evaluate").stdout
    bleu = float(re.search(r"SacreBLEU ([0-9.]+)", out).group(1))
    assert bleu > one_host_run[1], (bleu, one_host_run[1])


def test_stop_then_resume_continues_from_the_saved_update_on_both_hosts(data_ready):
    cfg = data_ready.cfg
    fab(data_ready, "train", "--new", "--detach", "--set", "max_update=40,save_interval_updates=10")
    run_id = latest_run_id()
    wait_for_update(cfg, run_id, 20)
    out = fab(data_ready, "stop").stdout
    assert "no training process left" in out
    for name in cfg.names:
        assert training_processes(cfg, name) == [], f"{name} still trains after fab stop"
    saved = {name: ssh(cfg, name, f"test -s {RUNS}/{run_id}/checkpoints/checkpoint_last.pt").returncode == 0
             for name in cfg.names}
    out = fab(data_ready, "train").stdout  # the latest run, resumed
    assert f"resuming {run_id} from update" in out
    # fairseq loads on every rank but only rank 0 logs it; every host had the checkpoint
    # (tandem copied it), so no rank skipped the broadcast and deadlocked.
    log = log_of(cfg, "v100a", run_id)
    resumed = [int(u) for u in re.findall(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", log)]
    assert resumed and resumed[-1] >= 10, resumed
    after = [int(r["num_updates"]) for r in inner_records(log.split("Loaded checkpoint")[-1])]
    assert after and after[0] > resumed[-1], f"restarted from 0 instead of {resumed[-1]}: {after}"
    assert saved["v100a"], "rank 0 had saved no checkpoint before the stop"
    assert ssh(cfg, "v100b", f"test -s {RUNS}/{run_id}/checkpoints/checkpoint_last.pt").returncode == 0
    assert "40/40" in out


def test_killing_one_rank_stops_the_other_within_a_minute(data_ready):
    cfg = data_ready.cfg
    fab(data_ready, "train", "--new", "--detach", "--set", "max_update=100000")
    run_id = latest_run_id()
    wait_for_update(cfg, run_id, 10)
    # The rank dies as in a crash or the OOM killer ([n]: the pattern misses pkill's own shell).
    ssh(cfg, "v100b", "pkill -9 -f fairseq-trai[n]")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and training_processes(cfg, "v100a"):
        time.sleep(2)
    left = training_processes(cfg, "v100a")
    fab(data_ready, "stop", check=False)
    assert left == [], f"v100a still trains a minute after v100b's rank died: {left}"
    status = fab(data_ready, "status", check=False).stdout
    assert "v100b stopped" in status or "stopped early" in status


@pytest.mark.parametrize("args, message", [
    (["--hosts", "v100a,v100z", "train", "--new"], "unknown host v100z: the inventory has v100a, v100b"),
    (["train", "--new", "--dataset", "nothing-here"], "v100a: no dataset at /data/tandem/datasets/nothing-here"),
    (["train", "--new", "--set", "max_updates=5"], "max_updates"),
])
def test_bad_input_fails_before_launching_anything(data_ready, args, message):
    proc = fab(data_ready, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    for name in data_ready.cfg.names:
        assert training_processes(data_ready.cfg, name) == []


def test_a_busy_rendezvous_port_is_named(data_ready):
    cfg = data_ready.cfg
    # SO_REUSEADDR: the previous test's rendezvous on 29500 may leave connections in TIME_WAIT,
    # which would make a plain bind fail and the holder exit (then the port is free after all)
    holder = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', 29500)); s.listen(); time.sleep(120)")
    pid = ssh(cfg, "v100a", f'nohup python3 -c "{holder}" >/dev/null 2>&1 & echo $!').stdout.strip()
    try:
        listening = ssh(cfg, "v100a", "for i in $(seq 50); do ss -Hltn 'sport = :29500' | grep -q . && exit 0; "
                                      "sleep 0.2; done; exit 1")
        assert listening.returncode == 0, "the test's port holder never listened on 29500"
        proc = fab(data_ready, "train", "--new", check=False)
        assert proc.returncode != 0
        assert "v100a: rendezvous port 29500 is in use" in proc.stdout
    finally:
        ssh(cfg, "v100a", f"kill {pid}")  # the process this test started, by its PID


def test_mismatched_versions_are_named_before_launch(data_ready):
    cfg = data_ready.cfg
    package = "$(/opt/tandem/venv/bin/python -c 'import fairseq,os; print(os.path.dirname(fairseq.__file__))')"
    version = f"{package}/version.py"
    ssh(cfg, "v100b", f"cp {version} /root/version.py.orig && echo '__version__ = \"0.12.0\"' > {version}")
    try:
        proc = fab(data_ready, "train", "--new", check=False)
    finally:
        ssh(cfg, "v100b", f"cp /root/version.py.orig {version}")
    assert proc.returncode != 0
    assert "v100b: fairseq 0.12.0 but v100a has 0.12.3.1" in proc.stdout


def test_the_report_of_a_real_run_answers_with_the_logs_figures(data_ready, two_host_run):
    run_id, _ = two_host_run
    out = fab(data_ready, "report", "--run", run_id).stdout
    page = TOP / "reports" / run_id / "index.html"
    assert f"report: {page}" in out.replace("\n", "")
    html = page.read_text()
    assert html.count("data:image/png;base64,") >= 8, "plots missing from the page"
    answers = {a["key"]: a for a in json.loads((page.parent / "answers.json").read_text())["answers"]}
    assert {"duration", "step_time", "improving", "overfit", "gpus", "network", "lr",
            "corpus", "checkpoints"} <= set(answers)
    records = inner_records((page.parent / "logs" / "v100a.log").read_text())
    mean = sum(1 / float(r["ups"]) for r in records) / len(records)
    assert answers["step_time"]["numbers"]["mean_s_per_update"] == pytest.approx(mean, rel=1e-6)
    assert answers["gpus"]["verdict"] == "absent"  # CPU hosts: absent, never 0 %
    assert answers["network"]["verdict"] == "not"  # the uncapped lab link is far from busy
    samples = (page.parent / "samples" / "v100b.jsonl").read_text().splitlines()
    assert len(samples) >= 5 and json.loads(samples[0])["gpus"] is None


def test_a_run_capped_at_100mbit_is_reported_network_bound(data_ready):
    """The field reports' trap on the lab: a port capped at 100 Mb/s, the report says the network was
    the bottleneck. The model is 13x tiny (15.75 MB of gradients, 1.3 s of all-reduce per update at
    100 Mb/s) on small batches (~0.3 s of compute): the all-reduce takes most of each step."""
    try:
        data_ready.shape("100mbit")
        fab(data_ready, "train", "--new", "--accept-slow-network", "--set",
            "max_update=12,log_interval=2,max_tokens=512,encoder_embed_dim=256,decoder_embed_dim=256,"
            "encoder_ffn_embed_dim=1024,decoder_ffn_embed_dim=1024")
    finally:
        data_ready.shape("none")
    run_id = latest_run_id()
    fab(data_ready, "report", "--run", run_id)  # the link as measured when the run started
    answers = json.loads((TOP / "reports" / run_id / "answers.json").read_text())["answers"]
    network = next(a for a in answers if a["key"] == "network")
    assert network["verdict"] == "network-bound", network["answer"]
