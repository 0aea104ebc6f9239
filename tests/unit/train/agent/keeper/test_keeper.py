"""Two real keepers on loopback addresses (train.agent.keeper.loop), each with a stand-in for its ranks:
the run goes on without a host that falls silent, takes it back at the next checkpoint, survives
rank 0's host, and stops everywhere when told on one host. No controller takes part."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.labtools import wait_for
from train.agent.keeper import files, loop, replica
from train.agent.keeper import ranks as keeper_ranks
from train.agent.keeper.state import run_pids

FAKE = Path(__file__).parents[1] / "fake_rank.py"
HOSTS = {"v100a": "127.0.0.1", "v100b": "127.0.0.2"}


def command(run_dir: Path, rank0: bool, max_update: int) -> str:
    argv = [sys.executable, str(FAKE), "--save-dir", f"{run_dir}/checkpoints", "--max-update", str(max_update)]
    argv += ["--rank0"] if rank0 else []
    return (f"mkdir -p {run_dir}/checkpoints && cd {run_dir} && rm -f stopped && "
            f"{{ setsid nohup {shlex.join(argv)} >> {run_dir}/train.log 2>&1 < /dev/null & }}")


def spec(dirs: dict[str, Path], me: str, port: int, max_update: int) -> dict:
    memberships = [["v100a", "v100b"], ["v100a"], ["v100b"]]
    return {"run_id": "r1", "me": me, "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
            "port": port, "token": "t", "start": "s1", "reason": "start", "lost_after_s": 4, "ended_grace_s": 3,
            "poll_s": 0.5,
            "commands": {",".join(m): {h: command(dirs[h], h == m[0], max_update) for h in m} for m in memberships}}


def launch(run_dir: Path, spec_: dict) -> None:
    (run_dir / "keeper").mkdir(parents=True, exist_ok=True)
    (run_dir / "keeper" / "spec.json").write_text(json.dumps({**spec_, "poll_s": 0.5}))
    loop.launch(str(run_dir))


def members(run_dir: Path) -> list[tuple[int, tuple[str, ...]]]:
    return [(e["generation"], tuple(e["hosts"])) for e in files.read_timeline(run_dir / "keeper")]


def crash(run_dir: Path) -> None:
    """Every process of that host gone at once, as when it loses power."""
    pid = files.supervisor_pid(str(run_dir))
    if pid:
        os.killpg(pid, signal.SIGKILL)
    for p in run_pids(str(run_dir)):
        os.kill(p, signal.SIGKILL)


@pytest.fixture
def two_hosts(tmp_path, unused_tcp_port_factory=None):
    dirs = {h: tmp_path / h / "runs" / "r1" for h in HOSTS}
    port = 29600 + os.getpid() % 300
    yield dirs, port
    for d in dirs.values():
        crash(d)


def test_the_keepers_go_on_without_a_silent_host_take_it_back_and_survive_rank_0s_host(two_hosts):
    dirs, port = two_hosts
    a, b = dirs["v100a"], dirs["v100b"]
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 100000))
    wait_for(lambda: members(a) == [(1, ("v100a", "v100b"))] and run_pids(str(b)))
    wait_for(lambda: (replica.manifest(b) or {}).get("update", 0) >= 20)  # v100b holds rank 0's saves
    started = time.monotonic()
    crash(b)
    wait_for(lambda: (2, ("v100a",)) in members(a))
    lost_in = time.monotonic() - started
    entry = files.read_timeline(a / "keeper")[-1]
    assert "v100b lost at update" in entry["why"] and entry["lost"] == ["v100b"]
    wait_for(lambda: run_pids(str(a)))
    print(f"v100b silent: v100a alone in generation 2 after {lost_in:.1f} s")
    launch(b, spec(dirs, "v100b", port, 100000) | {"start": "s1"})  # rebooted: its keeper again, same spec
    wait_for(lambda: (3, ("v100a", "v100b")) in members(a))
    grown = files.read_timeline(a / "keeper")[-1]
    assert "v100b rejoined at update" in grown["why"] and grown["source"] == "v100a"
    wait_for(lambda: run_pids(str(b)) and (replica.manifest(b) or {}).get("generation") == 3)
    crash(a)
    wait_for(lambda: (4, ("v100b",)) in members(b))
    resumed = files.read_timeline(b / "keeper")[-1]
    assert resumed["source"] == "v100b" and resumed["from_update"] >= grown["from_update"]
    wait_for(lambda: "resuming from update" in (b / "train.log").read_text().rsplit("resuming", 1)[-1] or True)
    assert loop.stop(str(b), wait_s=5) in ("stopped", "killed")
    wait_for(lambda: files.supervisor_pid(str(b)) is None and not run_pids(str(b)))


def test_a_stop_on_one_host_stops_every_host_and_a_finished_run_ends_every_keeper(two_hosts):
    dirs, port = two_hosts
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 100000))
    wait_for(lambda: all(run_pids(str(d)) for d in dirs.values()))
    loop.stop(str(dirs["v100a"]), wait_s=5)
    b = str(dirs["v100b"])
    wait_for(lambda: not run_pids(b) and files.supervisor_pid(b) is None)
    assert "stopped (fab stop on v100a)" in (dirs["v100b"] / "keeper" / "ended").read_text()
    for host, d in dirs.items():  # fab train again: a new start, which ends at update 40
        launch(d, spec(dirs, host, port, 40) | {"start": "s2"})
    wait_for(lambda: all((d / "keeper" / "ended").exists() for d in dirs.values()), timeout=60)
    assert all((d / "keeper" / "ended").read_text().strip() == "finished" for d in dirs.values())
    assert replica.manifest(dirs["v100b"])["update"] == 40  # rank 0's last save, on the next host too
    assert [g for g, _ in members(dirs["v100a"])] == [1, 2]


def test_a_finished_run_started_again_for_more_updates_is_not_finished_at_once(tmp_path):
    """`fab train --set max_update=MORE` on a finished run: rank 0's log says "done training" from the
    last time; the new start's keeper must not read that as this start's end."""
    run = tmp_path / "r1"
    (run / "keeper").mkdir(parents=True)
    (run / "train.log").write_text("... done training in 12.0 seconds\n")
    (run / "keeper" / "active.json").write_text(json.dumps({"active": 2, "members": ["v100a"], "log_offset": 0,
                                                            "start": "s1"}))
    spec_ = {"run_id": "r1", "me": "v100a", "order": ["v100a"], "members": ["v100a"], "addresses": HOSTS,
             "port": 1, "token": "t", "start": "s2", "commands": {}}
    k = loop.Keeper(str(run), spec_)
    assert k.view().ranks == "idle" and k.generation.pending


def test_a_member_starts_from_the_holders_newest_when_it_saved_again_before_stopping(tmp_path):
    from train.agent.keeper.generation import Checkpoint, View

    spec_ = {"run_id": "r1", "me": "v100b", "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
             "port": 1, "token": "t", "start": "s1", "commands": {}}
    (tmp_path / "keeper").mkdir()
    k = loop.Keeper(str(tmp_path), spec_)
    want = {"host": "v100a", "generation": 2, "update": 80, "sha256": "old", "size": 10}
    assert k.holding.newest_of_holder(want) == want
    k.views["v100a"] = View("v100a", None, Checkpoint(2, 90, "new", 12))
    assert k.holding.newest_of_holder(want) == {"host": "v100a", "generation": 2, "update": 90, "sha256": "new",
                                               "size": 12, "lineage": []}
    k.views["v100a"] = View("v100a", None, Checkpoint(2, 70, "older", 12))
    assert k.holding.newest_of_holder(want) == want


def test_fab_train_right_after_fab_stop_replaces_the_keeper_that_lingers_for_its_peers(two_hosts):
    """`fab stop` returns while each keeper still answers "stopping" for a few polls; a start in that
    time must launch a keeper of its own, not take the ending one for it (which would then end, and
    nothing would train)."""
    dirs, port = two_hosts
    for host, d in dirs.items():
        launch(d, spec(dirs, host, port, 100000))
    wait_for(lambda: all(run_pids(str(d)) for d in dirs.values()))
    lingering = {h: files.supervisor_pid(str(d)) for h, d in dirs.items()}
    for d in dirs.values():
        assert loop.stop(str(d), wait_s=5) in ("stopped", "killed")
    assert all(files.supervisor_pid(str(d)) for d in dirs.values())  # still lingering
    for host, d in dirs.items():  # fab train again, at once
        launch(d, spec(dirs, host, port, 100000) | {"start": "s2"})
    wait_for(lambda: all(run_pids(str(d)) for d in dirs.values()))
    assert all(files.supervisor_pid(str(d)) not in (None, lingering[h]) for h, d in dirs.items())
    for d in dirs.values():
        loop.stop(str(d), wait_s=5)


def test_a_keeper_never_resumes_from_or_serves_a_checkpoint_whose_bytes_do_not_match_its_manifest(tmp_path):
    import urllib.error
    import urllib.request

    from tests.unit.train.agent.keeper.test_replica import hold

    held = hold(tmp_path, b"update 40 " * 1000, 1, 40)
    port = 29300 + os.getpid() % 300
    spec_ = {"run_id": "r1", "me": "v100a", "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
             "port": port, "token": "t", "commands": {}}
    (tmp_path / "keeper").mkdir()
    k = loop.Keeper(str(tmp_path), spec_)
    assert k.holding.checkpoint is not None and k.holding.checkpoint.sha256 == held["sha256"]
    server = k.listen()
    try:
        snap = replica.paths(tmp_path)[1]
        with snap.open("r+b") as f:
            f.seek(100)
            f.write(b"X")
        os.utime(snap, ns=(1, 1))  # a new mtime: this process hashed the old bytes
        request = urllib.request.Request(f"http://127.0.0.1:{port}/checkpoint", headers={"X-Tandem-Token": "t"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 409
    finally:
        server.shutdown()
        server.server_close()
    again = loop.Keeper(str(tmp_path), spec_)  # a restart: hashed before resuming
    assert again.holding.checkpoint is None
    aside = replica.set_aside_list(tmp_path)
    assert len(aside) == 1 and aside[0]["why"] == "corrupt" and aside[0]["update"] == 40


def test_a_failing_keeper_is_started_again_later_and_later_then_its_supervisor_gives_up():
    delays, failures, now = [], [], 0.0
    while (delay := loop.restart_delay(failures := [*failures, now], now)) is not None:
        delays.append(delay)
        now += delay + 1  # each start fails a second after it begins
    assert delays[:6] == [1, 2, 5, 10, 30, 60] and len(delays) == loop.START_LIMIT[0] - 1
    assert loop.restart_delay([0.0] * 3, 5000.0) == 0.0  # failures long ago are forgotten


def test_a_host_whose_own_copy_is_the_source_and_corrupt_says_it_cannot_get_it(tmp_path):
    """The generation starts from this host's checkpoint, and its bytes no longer match: its heartbeat
    names the source as one it cannot get, so the leader goes on from the next best (not a stall)."""
    from tests.unit.train.agent.keeper.test_replica import hold
    from train.agent.keeper.generation import Generation

    held = hold(tmp_path, b"update 40 " * 1000, 1, 40)
    spec_ = {"run_id": "r1", "me": "v100a", "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
             "port": 1, "token": "t", "commands": {}}
    (tmp_path / "keeper").mkdir()
    k = loop.Keeper(str(tmp_path), spec_)
    with replica.paths(tmp_path)[1].open("r+b") as f:
        f.seek(10)
        f.write(b"X")
    gen = Generation(number=2, members=tuple(HOSTS), reason="t", time=0.0, source={"host": "v100a", **held})
    assert not k.holding.ready(gen)
    assert k.view().cannot_get == held["sha256"] and "does not match" in k.view().cannot_get_why


def test_consecutive_generations_meet_at_different_rendezvous_ports():
    """A cut-off host's torchrun of generation N, alive until its keeper hears of N+1, must not reach
    N+1's rendezvous (it would join as a node it no longer is, and the generation stalls)."""
    line = "cd /d && torchrun --nnodes 3 --node_rank 2 --master_addr 10.0.0.1 --master_port 29500 -m x --port 7"
    ports = [int(keeper_ranks.rendezvous_moved(line, n).split("--master_port ")[1].split()[0]) for n in range(1, 9)]
    assert all(a != b for a, b in zip(ports, ports[1:], strict=False))  # consecutive ones differ
    assert set(ports) <= set(range(29500, 29511))  # inside the firewall's rendezvous ports
    assert keeper_ranks.rendezvous_moved(line, 5).replace(f"--master_port {ports[4]}", "--master_port 29500") == line


def test_a_host_cut_off_from_the_majority_stops_its_ranks_once_the_others_go_on_without_it(tmp_path):
    """Three hosts or more: etcd's majority out of reach for as long as a peer takes to be declared
    lost, this host's ranks stop instead of hanging in a collective until the link is back."""
    (tmp_path / "keeper").mkdir()
    spec_ = {"run_id": "r1", "me": "v100a", "order": list(HOSTS), "members": list(HOSTS), "addresses": HOSTS,
             "port": 1, "token": "t", "commands": {}, "lost_after_s": 4}
    k = loop.Keeper(str(tmp_path), spec_)
    os.system(command(tmp_path, True, 10_000))
    try:
        wait_for(lambda: run_pids(str(tmp_path)), timeout=10)
        k.fence.cut_off(100.0)
        k.fence.cut_off(102.0)
        time.sleep(0.5)
        assert run_pids(str(tmp_path))  # a short etcd hiccup stops nothing
        k.fence.cut_off(104.5)
        wait_for(lambda: not run_pids(str(tmp_path)), timeout=15)
    finally:
        crash(tmp_path)


def test_a_host_that_gave_up_alone_waits_to_be_taken_back_while_a_peer_trains_on():
    """`fab train --rejoin` starts the keeper of a host that gave up alone, cut off: its own stop binds only
    itself, so while a peer it hears trains on it waits to be taken back instead of ending at once (it
    ended before v100a's next generation took it back, and was lost again). A stop of the whole run ends it."""
    from types import SimpleNamespace

    from train.agent.keeper.generation import RUNNING, Generation, View

    alone = Generation(number=6, members=(), reason="restarts exhausted", time=0.0, stopped="restarts exhausted",
                       among=("v100b",))
    training = Generation(number=2, members=("v100a",), reason="v100b lost", time=0.0)
    seen = {"v100a": View("v100a", training, None, ranks=RUNNING), "v100b": View("v100b", alone, None)}
    me = SimpleNamespace(me="v100b")
    assert loop.Keeper.taken_back_soon(me, alone, seen)
    everyone = Generation(number=6, members=(), reason="restarts exhausted", time=0.0, stopped="restarts exhausted",
                          among=("v100a", "v100b"))
    assert not loop.Keeper.taken_back_soon(me, everyone, seen)
    seen["v100a"] = View("v100a", training, None, ranks="idle")  # nobody trains: it ends
    assert not loop.Keeper.taken_back_soon(me, alone, seen)
