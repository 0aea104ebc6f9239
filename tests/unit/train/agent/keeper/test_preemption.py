"""A cloud's notice that it reclaims a host (train.agent.keeper.preemption): heard from that cloud's metadata
server only, and the run goes on without the host from a save rank 0 makes at once.

The metadata servers are real HTTP servers on loopback answering as each cloud documents its own:
AWS's IMDSv2 (a session token, then 404 or the instance action), GCP's (Metadata-Flavor checked,
FALSE/TRUE), Azure's Scheduled Events (the Metadata header checked, events for other VMs too). These
are recorded answers, not the clouds themselves."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.labtools import wait_for
from train.agent.keeper import files as keeper_files
from train.agent.keeper import loop, preemption, replica
from train.agent.keeper.state import run_pids
from train.agent.trainer.checkpoint_info import read as checkpoint_read

# --- the clouds' metadata servers, as documented

AWS_TOKEN = "AQAEAFdOsX_t0k3n=="


class Recorded(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.handle_one(self)

    do_PUT = do_GET


@contextlib.contextmanager
def metadata(answer):
    """A metadata server on loopback: `answer(handler) -> (status, body)`; every request recorded."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorded)
    server.daemon_threads = True
    server.requests = []

    def handle_one(h):
        server.requests.append((h.command, h.path, dict(h.headers)))
        status, body = answer(h)
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    server.handle_one = handle_one
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def aws(state: dict):
    """IMDSv2: PUT /latest/api/token with a TTL header gives a token; a GET without it is 401;
    spot/instance-action is 404 until the instance is marked."""

    def answer(h):
        if h.command == "PUT":
            ttl = h.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            ok = h.path == "/latest/api/token" and ttl.isdigit() and 1 <= int(ttl) <= 21600
            return (200, AWS_TOKEN.encode()) if ok else (400, b"")
        if h.headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
            return 401, b""
        if h.path == "/latest/meta-data/spot/instance-action" and state.get("action"):
            return 200, json.dumps(state["action"]).encode()
        return 404, b"<html><body><h1>404 - Not Found</h1></body></html>"

    return answer


def gcp(state: dict):
    def answer(h):
        if h.headers.get("Metadata-Flavor") != "Google":
            return 403, b"Missing required header: Metadata-Flavor"
        values = {"/computeMetadata/v1/instance/preempted": state.get("preempted", "FALSE"),
                  "/computeMetadata/v1/instance/maintenance-event": state.get("maintenance", "NONE")}
        return (200, values[h.path].encode()) if h.path in values else (404, b"")

    return answer


def azure(state: dict):
    def answer(h):
        if h.headers.get("Metadata") != "true":
            return 400, b'{"error": "Bad request. Required metadata header not specified"}'
        if h.path == "/metadata/instance/compute/name?api-version=2021-02-01&format=text":
            return 200, b"v100b-vm"
        if h.path == "/metadata/scheduledevents?api-version=2020-07-01":
            return 200, json.dumps({"DocumentIncarnation": len(state.get("events", [])),
                                    "Events": state.get("events", [])}).encode()
        return 404, b""

    return answer


def azure_event(kind: str, vm: str, not_before: str = "Mon, 19 Sep 2016 18:29:47 GMT") -> dict:
    return {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": kind, "ResourceType": "VirtualMachine",
            "Resources": [vm], "EventStatus": "Scheduled", "NotBefore": not_before, "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1}


def dmi(tmp_path: Path, name: str, **files: str) -> Path:
    folder = tmp_path / f"dmi-{name}"
    folder.mkdir()
    for key, value in files.items():
        (folder / key).write_text(value + "\n")
    return folder


# --- which cloud, and only its endpoint


def test_each_cloud_is_told_from_its_dmi_and_no_cloud_is_none(tmp_path):
    hosts = {
        "aws-nitro": ({"sys_vendor": "Amazon EC2", "product_name": "p4d.24xlarge", "bios_version": "1.0"}, "AWS"),
        "aws-xen": ({"sys_vendor": "Xen", "product_name": "HVM domU", "bios_version": "4.11.amazon"}, "AWS"),
        "gcp": ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, "GCP"),
        "azure": ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine",
                   "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77"}, "Azure"),
        # Hyper-V on premises says the same as Azure but for the asset tag
        "hyper-v": ({"sys_vendor": "Microsoft Corporation", "product_name": "Virtual Machine",
                     "chassis_asset_tag": "None"}, None),
        "qemu": ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, None),
        "container": ({}, None),
    }
    for name, (files, cloud) in hosts.items():
        found = preemption.detect(dmi(tmp_path, name, **files))
        assert (found.name if found else None) == cloud, name


def test_off_a_cloud_nothing_is_asked_on_a_cloud_vm_its_own_endpoint_is(tmp_path, monkeypatch):
    with metadata(aws({})) as (server, url):
        monkeypatch.setenv("TANDEM_TEST_METADATA_URL", url)
        assert preemption.watch("v100b", poll_s=0.05, dmi=dmi(tmp_path, "qemu", sys_vendor="QEMU")) is None
        time.sleep(0.3)
        assert server.requests == []
        watcher = preemption.watch("v100b", poll_s=0.05, dmi=dmi(tmp_path, "aws", sys_vendor="Amazon EC2"))
        try:
            deadline = time.monotonic() + 10
            while len(server.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            watcher.stop()
        assert [(m, p) for m, p, _ in server.requests[:2]] == [("PUT", "/latest/api/token"),
                                                             ("GET", "/latest/meta-data/spot/instance-action")]
        assert watcher.notice is None and watcher.error == ""


def test_aws_spot_notice_through_imdsv2():
    state: dict = {}
    with metadata(aws(state)) as (server, url):
        cloud = preemption.Aws(url)
        assert cloud.notice("v100b", time.time()) is None  # 404: none
        state["action"] = {"action": "terminate", "time": "2026-05-01T14:02:11Z"}
        notice = cloud.notice("v100b", time.time())
        assert notice.words() == "AWS spot notice (terminate at 14:02:11Z)"
        assert notice.deadline == 1777644131.0
        assert [m for m, _, _ in server.requests].count("PUT") == 1  # the session token is kept


def test_gcp_preemption_and_a_terminating_maintenance_event():
    state: dict = {}
    with metadata(gcp(state)) as (_, url):
        cloud = preemption.Gcp(url)
        assert cloud.notice("v100b", 1000.0) is None
        state["maintenance"] = "MIGRATE_ON_HOST_MAINTENANCE"  # live migration: the host stays
        assert cloud.notice("v100b", 1000.0) is None
        state["maintenance"] = "TERMINATE_ON_HOST_MAINTENANCE"
        assert cloud.notice("v100b", 1000.0) == preemption.Notice("GCP", "maintenance event", "terminate", 1030.0)
        state["preempted"] = "TRUE"
        assert cloud.notice("v100b", 1000.0) == preemption.Notice("GCP", "preemption notice", "stop", 1030.0)


def test_azure_counts_only_an_event_for_this_vm_that_takes_it_away():
    state: dict = {"events": [azure_event("Preempt", "v100a-vm")]}
    with metadata(azure(state)) as (_, url):
        cloud = preemption.Azure(url)
        assert cloud.notice("v100b", 1000.0) is None  # another VM of the scale set
        state["events"].append(azure_event("Freeze", "v100b-vm"))
        assert cloud.notice("v100b", 1000.0) is None  # seconds long: the host stays
        state["events"].append(azure_event("Preempt", "v100b-vm"))
        notice = cloud.notice("v100b", 1000.0)
        assert notice.words() == "Azure scheduled event (Preempt at 18:29:47Z)" and notice.deadline == 1474309787.0


def test_an_endpoint_that_does_not_answer_is_said_once_and_never_raised():
    said: list[str] = []
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        watcher = preemption.Watcher(preemption.Aws(f"http://127.0.0.1:{silent.getsockname()[1]}"), "v100b",
                                     say=said.append)
        started = time.monotonic()
        assert watcher.poll() is None and watcher.poll() is None
        assert time.monotonic() - started < 3 * preemption.TIMEOUT_S
    with metadata(lambda h: (500, b"")) as (_, url):
        watcher.cloud = preemption.Gcp(url)
        assert watcher.poll() is None
    assert len(said) == 2 and "did not answer" in said[0] and "HTTP 500" in said[1]


# --- rank 0 saves now: a real (tiny) fairseq training on this CPU

WORDS = ["the", "dog", "cat", "sees", "a", "big", "small", "house", "runs", "and"]


def tiny_corpus(folder: Path) -> Path:
    """A raw-text language-modelling corpus fairseq reads without binarizing (--dataset-impl raw)."""
    import random

    folder.mkdir()
    pick = random.Random(0)
    for split, lines in (("train", 3000), ("valid", 20)):
        (folder / split).write_text("".join(" ".join(pick.choice(WORDS) for _ in range(pick.randint(4, 12))) + "\n"
                                            for _ in range(lines)))
    (folder / "dict.txt").write_text("".join(f"{w} 100\n" for w in WORDS))
    return folder


def logged_update(log: Path) -> int:
    from train.agent.keeper.state import last_update

    return last_update(log) or 0


def test_rank_0_saves_at_the_end_of_its_update_when_signalled_and_trains_on(tmp_path):
    """No save is due (no interval saves, an epoch save every 1000 epochs): the checkpoint that
    appears is the one the signal asked for, at the update training had reached, and training goes on."""
    pytest.importorskip("fairseq")
    data, save, log = tiny_corpus(tmp_path / "data"), tmp_path / "checkpoints", tmp_path / "train.log"
    argv = [sys.executable, "-m", "train.agent.trainer.fairseq_train", str(data), "--dataset-impl", "raw",
            "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
            "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
            "--tokens-per-sample", "16", "--max-tokens", "64", "--optimizer", "adam", "--lr", "0.001", "--cpu",
            "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--save-interval", "1000",
            "--disable-validation", "--no-epoch-checkpoints", "--max-update", "100000", "--save-dir", str(save)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while logged_update(log) < 10 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert logged_update(log) >= 10, log.read_text()[-3000:]
        assert not (save / "checkpoint_last.pt").exists()
        assert preemption.rank0_pid(tmp_path) == proc.pid  # its pid file, checked against the run's processes
        at_signal = logged_update(log)
        assert preemption.save_now(tmp_path) == ""
        while not (save / "checkpoint_last.pt").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        saved = checkpoint_read(save / "checkpoint_last.pt")["update"]
        assert at_signal <= saved <= logged_update(log), log.read_text()[-3000:]
        while logged_update(log) < saved + 5 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None and logged_update(log) >= saved + 5  # it trains on
        assert f"tandem: saving now at update {saved}" in log.read_text()
    finally:
        proc.kill()
        proc.wait()


# --- the keepers: two real keepers on loopback, v100b's cloud says it goes

FAKE = Path(__file__).parents[1] / "fake_rank.py"
HOSTS = {"v100a": "127.0.0.1", "v100b": "127.0.0.2"}


def command(run_dir: Path, rank0: bool) -> str:
    argv = [sys.executable, str(FAKE), "--save-dir", f"{run_dir}/checkpoints", "--save-every", "100000"]
    argv += ["--rank0"] if rank0 else []
    return (f"mkdir -p {run_dir}/checkpoints && cd {run_dir} && rm -f stopped && "
            f"{{ setsid nohup {shlex.join(argv)} >> {run_dir}/train.log 2>&1 < /dev/null & }}")


def launch(dirs: dict[str, Path], me: str, port: int) -> None:
    memberships = [["v100a", "v100b"], ["v100a"], ["v100b"]]
    spec = {"run_id": "r1", "me": me, "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
            "port": port, "token": "t", "start": "s1", "reason": "start", "lost_after_s": 30, "ended_grace_s": 3,
            "poll_s": 0.5, "commands": {",".join(m): {h: command(dirs[h], h == m[0]) for h in m} for m in memberships}}
    (dirs[me] / "keeper").mkdir(parents=True, exist_ok=True)
    (dirs[me] / "keeper" / "spec.json").write_text(json.dumps(spec))
    loop.launch(str(dirs[me]))


def timeline(run_dir: Path) -> list[dict]:
    return keeper_files.read_timeline(run_dir / "keeper")


def test_a_spot_notice_has_rank_0_save_now_and_the_run_go_on_without_that_host(tmp_path, monkeypatch):
    """v100b's cloud says it terminates in a minute. v100a (rank 0, leader) saves at once (no save is
    due otherwise) and generation 2 goes on without v100b from that save, long before the 30 s of
    silence a lost host takes; v100b's ranks stop."""
    dirs = {h: tmp_path / h / "runs" / "r1" for h in HOSTS}
    port = 29300 + os.getpid() % 300
    state: dict = {}
    try:
        with metadata(aws(state)) as (_, url):
            monkeypatch.setenv("TANDEM_TEST_DMI", str(dmi(tmp_path, "aws", sys_vendor="Amazon EC2")))
            monkeypatch.setenv("TANDEM_TEST_METADATA_URL", url)
            launch(dirs, "v100b", port)
            monkeypatch.delenv("TANDEM_TEST_DMI")
            monkeypatch.delenv("TANDEM_TEST_METADATA_URL")
            launch(dirs, "v100a", port)
            a, b = dirs["v100a"], dirs["v100b"]
            wait_for(lambda: run_pids(str(a)) and run_pids(str(b)) and logged_update(a / "train.log") > 5)
            assert replica.manifest(a) is None  # no save yet: --save-every 100000
            when = time.time() + 60
            state["action"] = {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))}
            noticed = time.monotonic()
            wait_for(lambda: any(g["generation"] == 2 for g in timeline(a)))
            took = time.monotonic() - noticed
            entry = timeline(a)[-1]
            assert entry["hosts"] == ["v100a"] and "v100b leaving at update" in entry["why"]
            assert "AWS spot notice (terminate at" in entry["why"]
            assert entry["source"] == "v100a" and entry["from_update"] > 5  # rank 0's save at the notice
            assert took < 20, f"generation 2 after {took:.1f} s"
            said = (a / "keeper" / "keeper.log").read_text()
            at = time.strftime("%H:%M:%SZ", time.gmtime(int(when)))
            assert f"v100b: AWS spot notice (terminate at {at}): saving now, going on without v100b" in said
            wait_for(lambda: not run_pids(str(b)))  # its ranks of generation 1 stopped
            wait_for(lambda: run_pids(str(a)) and "resuming from update" in (a / "train.log").read_text())
            assert "goes on without this host" in (b / "keeper" / "keeper.log").read_text()
            print(f"v100b's notice: generation 2 (v100a from update {entry['from_update']}) after {took:.1f} s")
    finally:
        for d in dirs.values():
            pid = keeper_files.supervisor_pid(str(d))
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            for p in run_pids(str(d)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
