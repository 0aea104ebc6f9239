"""`fab train` on the provisioned lab, for real: CPU, gloo, the tiny preset, synthetic data_ready."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from labtools import FAB, TOP, fab, set_links, ssh

RUNS = "/data/tandem/runs"
# fairseq's heartbeat ends a rank blocked on a lost peer: 45 s by default (the vanished-network test
# keeps it); 20 s where a test only needs the run to notice, to keep the suite short.
QUICK_HEARTBEAT = "heartbeat_timeout=20"
# torchrun's worker (`python3 -u -m ...`), not torchrun, whose command line names the module too;
# the brackets keep the pattern from matching pkill's own shell.
KILL_THE_RANK = "pkill -9 -f 'python[0-9.]* -u -m train[.]agent[.]trainer[.]fairseq_train'"




def training_processes(cfg, name: str) -> list[str]:
    out = ssh(cfg, name, "pgrep -af 'fairseq_train|torchrun' || true").stdout
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
def one_host_run(data_ready):
    """The same model on one host for a few updates: the baseline for tokens per batch, and an
    (almost) untrained model for BLEU."""
    run_id = time.strftime("run-one-%Y%m%d-%H%M%S")  # named: reports/latest is shared by the checkout
    fab(data_ready, "--hosts", "v100a", "train", "--new", "--run", run_id, "--set",
        "max_update=3,save_interval_updates=3,log_interval=1")
    out = fab(data_ready, "--hosts", "v100a", "evaluate", "--run", run_id, "--checkpoint", "checkpoint_last.pt").stdout
    return run_id, float(re.search(r"SacreBLEU ([0-9.]+)", out).group(1))


@pytest.fixture(scope="module")
def two_host_run(data_ready, one_host_run):
    # as in a CI log or under `| tee`: not a terminal, no COLUMNS
    run_id = time.strftime("run-two-%Y%m%d-%H%M%S")
    out = fab(data_ready, "train", "--new", "--run", run_id, "--set", "max_update=60", columns=None).stdout
    return run_id, out


def test_progress_is_whole_lines_when_output_is_not_a_terminal(two_host_run):
    run_id, out = two_host_run
    progress = [line for line in out.splitlines() if line.startswith(f"{run_id} ")]
    assert progress, out
    assert progress[-1].startswith(f"{run_id} 60/60 · loss ") and " ETA " in progress[-1], progress
    assert not any("…" in line for line in out.splitlines()), out  # rich's cut at 80 columns


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
    out = fab(data_ready, "evaluate", "--run", two_host_run[0]).stdout
    bleu = float(re.search(r"SacreBLEU ([0-9.]+)", out).group(1))
    assert bleu > one_host_run[1], (bleu, one_host_run[1])


def test_stop_then_resume_continues_from_the_saved_update_on_both_hosts(data_ready):
    """With local SGD (--comm local-sgd:5, outer momentum 0.5), the strategy whose resume has the most to carry: the run
    keeps its strategy and the checkpoint its outer state (BMUF's last synced model and momentum)."""
    cfg = data_ready.cfg
    # 120 updates: local SGD runs ~0.2 s an update on a quiet lab, and `fab stop` must land before
    # the end (40 were done before it in a fresh-clone CI)
    fab(data_ready, "train", "--new", "--detach", "--comm", "local-sgd:5", "--set",
        "max_update=120,save_interval_updates=10,block_momentum=0.5")
    run_id = latest_run_id()
    wait_for_update(cfg, run_id, 20)
    out = fab(data_ready, "stop").stdout
    assert "no training process left" in out
    for name in cfg.names:
        assert training_processes(cfg, name) == [], f"{name} still trains after fab stop"
    status = fab(data_ready, "status", check=False).stdout
    assert "stopped by fab stop at update" in status and "died" not in status, status
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
    assert "120/120" in out
    assert log.count("'use_bmuf': True") == 2 and "'global_sync_iter': 5" in log, "not local SGD every 5, twice"
    assert json.loads((TOP / "reports" / run_id / "run.json").read_text())["comm"] == "local-sgd:5"
    checkpoint = f"{RUNS}/{run_id}/checkpoints/checkpoint_last.pt"
    # BMUF's own update count went on from the checkpoint's (a count restarted at 0 after the resume would
    # be 120 - the resumed update here: the synchronous start again, the syncs shifted)
    has_outer_state = (f"import torch; c = torch.load('{checkpoint}', weights_only=False); "
                       "o = c['last_optimizer_state']; print('tandem_bmuf' in o, o.get('tandem_bmuf_updates'), "
                       "c['optimizer_history'][-1]['num_updates'])")
    check = ssh(cfg, "v100a", f'/opt/tandem/venv/bin/python -c "{has_outer_state}"')
    assert check.stdout.strip().splitlines()[-1] == "True 120 120", check.stdout + check.stderr


@pytest.mark.extra(covered_by="test_agreement_lab.py: the split (v100b's ranks SIGKILLed, its keeper starts them "
                              "again from its newest checkpoint, `fab status` after), the isolated host (crashes "
                              "restarted until its budget is spent)")
def test_a_killed_rank_is_restarted_by_the_hosts_keepers_from_the_newest_checkpoint(data_ready):
    """v100b's rank dies as in a crash or the OOM killer, nobody following: the hosts' keepers start the
    same hosts again from the newest checkpoint (no host is lost: both answer), and `fab status` lists
    the restart with its reason."""
    cfg = data_ready.cfg
    run_id = time.strftime("run-killed-%Y%m%d-%H%M%S")
    fab(data_ready, "train", "--new", "--detach", "--run", run_id, "--set",
        "max_update=100000,save_interval_updates=25")
    wait_for_update(cfg, run_id, 35)  # past the first checkpoint (25)
    ssh(cfg, "v100b", KILL_THE_RANK)
    killed = time.monotonic()
    try:  # a new run loads no checkpoint at its start: the first "Loaded checkpoint" is the restart's
        while time.monotonic() - killed < 120 and "Loaded checkpoint" not in log_of(cfg, "v100a", run_id):
            time.sleep(2)
        took = time.monotonic() - killed
        status = fab(data_ready, "status", "--run", run_id, check=False).stdout
    finally:
        fab(data_ready, "stop", "--run", run_id, check=False)
    assert log_of(cfg, "v100a", run_id).count("Loaded checkpoint") == 1, f"no restart in {took:.0f} s"
    assert re.search(r"generation 2: v100a, v100b from update \d+ \(v100a's checkpoint\).*ranks ended at update",
                     " ".join(status.split())), status
    print(f"v100b's rank killed: both hosts training again from the checkpoint {took:.0f} s later")


def test_following_a_run_whose_rank_is_killed_fails_naming_the_culprit(data_ready):
    """`fab train` follows; v100b's rank is SIGKILLed at update ~10: fab exits non-zero with one
    line naming the host, the rank, the signal and the update (not a 0 and a red cell)."""
    cfg = data_ready.cfg
    env = {**os.environ, "FABRIC_INVENTORY": str(data_ready.inventory), "COLUMNS": "200"}
    before = latest_run_id() if (TOP / "reports" / "latest").exists() else None
    follower = subprocess.Popen([FAB, "train", "--new", "--no-elastic", "--set", "max_update=100000"], cwd=TOP,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while latest_run_id() == before and time.monotonic() < deadline:  # the new run's run.json
            time.sleep(1)
        wait_for_update(cfg, latest_run_id(), 10)
        ssh(cfg, "v100b", KILL_THE_RANK)
        out, _ = follower.communicate(timeout=180)
    finally:
        if follower.poll() is None:
            follower.kill()
            fab(data_ready, "stop", check=False)
    assert follower.returncode != 0, out[-3000:]
    assert re.search(r"v100b: rank 1 killed by SIGKILL at update \d+; the others stopped", out), out[-3000:]


def test_losing_rank_0s_host_goes_on_on_v100b_from_its_own_copy(data_ready):
    """Rank 0's host (v100a) vanishes (both cables) while `fab train` follows: v100b's keeper, which
    fetched each of rank 0's checkpoints, goes on alone from its copy (update-freq 2), reaches the
    last update, the follower ends with it, and `fab report` marks the change.
    The run is named: reports/latest is shared by everyone training from this checkout. (Losing
    a host that is not rank 0's: tests/training/test_three_hosts.py.)"""
    cfg = data_ready.cfg
    env = {**os.environ, "FABRIC_INVENTORY": str(data_ready.inventory), "COLUMNS": "200"}
    run_id = time.strftime("run-rank0-lost-%Y%m%d-%H%M%S")
    follower = subprocess.Popen([FAB, "train", "--new", "--run", run_id, "--set",
                                 f"max_update=70,save_interval_updates=10,{QUICK_HEARTBEAT}"], cwd=TOP, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_update(cfg, run_id, 22)
        set_links(cfg, "v100a", "down")
        out, _ = follower.communicate(timeout=600)
    finally:
        set_links(cfg, "v100a", "up")
        if follower.poll() is None:
            follower.kill()
            fab(data_ready, "stop", "--run", run_id, check=False)
    assert follower.returncode == 0, out[-4000:]
    start = re.search(r"started\s+on\s+2\s+hosts\s+\(tiny;\s+batch\s+2\s+hosts\s+x\s+1\s+rank\s+x\s+2,048\s+"
                      r"tokens\s+x\s+update-freq\s+1\s+=\s+4,096\s+tokens\s+per\s+update;\s+"
                      r"[^;]*tokens\s+per\s+update\s+x\s+70\s+updates[^;]*epochs[^;]*;\s+"  # the run's length
                      r"(checkpoint\s+every\s+10\s+updates\s+(?:as\s+set\s+)?\([^)]*\));", out)
    assert start, out[:3000]  # bounded loss: the interval, and its time or that it is unmeasured
    print(" ".join(start.group(1).split()))
    said = re.search(r"generation 2: v100b from update (\d+) \(v100b's checkpoint\), update-freq 2; "
                     r"v100a lost at update ([\d,]+)", out)
    assert said, out[-4000:]
    resumed, lost_at = int(said.group(1)), said.group(2)
    log = log_of(cfg, "v100b", run_id)
    loaded = re.findall(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", log)
    assert loaded and int(loaded[-1]) == resumed, loaded
    after = [int(r["num_updates"]) for r in inner_records(log.split("Loaded checkpoint")[-1])]
    assert after and after[0] > resumed and after[-1] >= 60, after
    assert "done training" in log
    members = json.loads((TOP / "reports" / run_id / "run.json").read_text())["members"]
    assert [m["hosts"] for m in members] == [["v100a", "v100b"], ["v100b"]], members
    print(f"v100a lost at update {lost_at}; v100b went on from {resumed} (its own copy)")

    fab(data_ready, "report", "--run", run_id)
    answers = {a["key"]: a for a in json.loads((TOP / "reports" / run_id / "answers.json").read_text())["answers"]}
    changes = answers["members"]["numbers"]["changes"]
    if changes != [f"v100a lost at {lost_at}"]:  # open: the report's sync chose v100a's side of the split
        pytest.xfail(f"open (2026-11-26): the report's membership after the split is v100a's side, {changes}, "
                     f"while run.json said v100b's; the closing note")
    assert "Membership (which hosts trained when)" in (TOP / "reports" / run_id / "index.html").read_text()
    # the progress is v100a's log up to the loss, then v100b's: collected from both
    from train.report import answers as A

    logged = [iv.update for iv in A.analyze(A.load(TOP / "reports" / run_id)).intervals]
    assert logged[0] == 10 and logged[-1] == 70 and resumed + 10 in logged, logged

    # resumed on the host it has now, 10 more updates: the start line times the interval with the run's own pace
    again = fab(data_ready, "--hosts", "v100b", "train", "--run", run_id, "--set", "max_update=80").stdout
    measured = re.search(r"checkpoint\s+every\s+10\s+updates\s+(?:as\s+set\s+)?\(≈\s+\d+\s+s\s+at\s+[\d.]+\s+s/update,"
                         r"\s+this\s+run's\s+log\)", again)
    assert measured, again[-3000:]
    print(" ".join(measured.group(0).split()))


def run_processes(run_id: str) -> list[str]:
    """Every process of the run on every lab host (they share this machine's process table)."""
    out = subprocess.run(["pgrep", "-af", run_id], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_a_frozen_host_leaves_no_frozen_rank_behind_and_the_run_goes_on(data_ready):
    """v100b's ranks are frozen (SIGSTOP: a VM paused by its provider, a process stuck in the kernel)
    while the run is detached. v100a's rank blocks on them; its heartbeat ends it, the keepers start
    both hosts again, and the frozen ranks, which can end nothing themselves, are killed on the way."""
    cfg = data_ready.cfg
    run_id = time.strftime("run-frozen-%Y%m%d-%H%M%S")  # named: reports/latest is shared by the checkout
    fab(data_ready, "train", "--new", "--detach", "--run", run_id, "--set",
        f"max_update=100000,save_interval_updates=25,{QUICK_HEARTBEAT}")
    wait_for_update(cfg, run_id, 35)  # past the first checkpoint (25)
    frozen_pids = ssh(cfg, "v100b",
                      "pgrep -f 'python[0-9.]* -u -m train[.]agent[.]trainer[.]fairseq_train'").stdout.split()
    ssh(cfg, "v100b", "pkill -STOP -f 'python[0-9.]* -u -m train[.]agent[.]trainer[.]fairseq_train'")
    frozen = time.monotonic()
    try:
        def frozen_left():
            return [p for p in frozen_pids if ssh(cfg, "v100b", f"test -d /proc/{p}").returncode == 0]
        while frozen_left() and time.monotonic() - frozen < 150:
            time.sleep(2)
        took = time.monotonic() - frozen
        left = frozen_left()
        while time.monotonic() - frozen < 240 and "Loaded checkpoint" not in log_of(cfg, "v100a", run_id):
            time.sleep(2)
        again = time.monotonic() - frozen
    finally:
        fab(data_ready, "stop", "--run", run_id, check=False)
    assert left == [], f"v100b's frozen ranks {left} still there {took:.0f} s after they froze"
    assert log_of(cfg, "v100a", run_id).count("Loaded checkpoint") == 1, "the run did not go on"
    print(f"v100b's ranks froze: gone {took:.0f} s later, both hosts training again after {again:.0f} s")


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
    # the venv is root's (provisioning made it): the login user edits it through sudo
    assert ssh(cfg, "v100b", f"cp {version} /root/version.py.orig && echo '__version__ = \"0.12.0\"' > {version}",
               sudo=True).returncode == 0
    try:
        proc = fab(data_ready, "train", "--new", check=False)
    finally:
        ssh(cfg, "v100b", f"cp /root/version.py.orig {version}", sudo=True)
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


def test_predict_names_the_comm_that_would_reach_90_percent_on_a_slow_link(data_ready):
    # the tiny model's 1.2 MB of gradients over 10 Mbit/s take ~1 s, its compute 0.05 s: network-bound
    done = fab(data_ready, "predict", "--link", "10", "--compute-s", "0.05", check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert re.search(r"--comm local-sgd:\d+ would reach 9\d% of the compute speed", done.stdout), done.stdout
    auto = fab(data_ready, "predict", "--link", "10", "--compute-s", "0.05", "--comm", "auto", check=False).stdout
    assert re.search(r"choice: --comm local-sgd:\d+: .* \(reaches 90%\)", auto), auto
