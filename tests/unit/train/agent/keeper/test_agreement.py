"""Three keepers agree through a real etcd cluster (three `etcd` members on loopback addresses,
train.agent.keeper.etcd): one generation at a time, written by compare-and-swap; a one-sided
partition of the heartbeats settles on one generation instead of two leaders taking turns; a keeper
whose side cannot reach etcd's majority starts no ranks. The keepers run in this process, rounds
driven by the test, their heartbeats real HTTP (a partition: a peer's answers dropped)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.unit.train.agent.keeper.test_keeper import command
from train.agent.keeper import consensus, files, loop
from train.agent.keeper import etcd as agreement
from train.agent.keeper.state import run_pids

needs_etcd = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd-server is not installed (make test-setup)")

HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2", "c": "127.0.0.3"}


def spec(dirs: dict[str, Path], me: str, port: int) -> dict:
    order = list(HOSTS)
    subsets = [["a", "b", "c"], ["a", "b"], ["a", "c"], ["b", "c"], ["a"], ["b"], ["c"]]
    return {"run_id": f"r{port}", "me": me, "order": order, "members": order, "addresses": HOSTS, "port": port,
            "token": "t", "start": "s1", "reason": "start", "lost_after_s": 3, "ended_grace_s": 3, "poll_s": 0.3,
            "commands": {",".join(m): {h: command(dirs[h], h == m[0], 100000) for h in m} for m in subsets}}


class Cluster:
    """Three keepers, their etcd members and heartbeat servers; `cut` drops heartbeats between pairs."""

    def __init__(self, tmp_path: Path, port: int):
        self.dirs = {h: tmp_path / h / "r1" for h in HOSTS}
        self.cut: set[frozenset[str]] = set()
        self.keepers, self.servers, self.etcd = {}, [], {}
        for host, run_dir in self.dirs.items():
            (run_dir / "keeper").mkdir(parents=True)
            self.etcd[host] = consensus.etcd_member(str(run_dir), spec(self.dirs, host, port))
        for host, run_dir in self.dirs.items():
            k = loop.Keeper(str(run_dir), spec(self.dirs, host, port))
            asks = k.ask
            k.ask = lambda peer, me=host, asks=asks: None if frozenset((me, peer)) in self.cut else asks(peer)
            self.keepers[host] = k
            self.servers.append(k.listen())

    def rounds(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for k in self.keepers.values():
                k.step()
            time.sleep(0.3)

    def timeline(self, host: str) -> list[tuple[int, tuple[str, ...]]]:
        return [(e["generation"], tuple(e["hosts"])) for e in files.read_timeline(self.dirs[host] / "keeper")]

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for run_dir in self.dirs.values():
            for pid in run_pids(str(run_dir)):
                os.kill(pid, signal.SIGKILL)
        for pid in self.etcd.values():
            if pid:
                consensus.stop_etcd_member(pid)


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, 29700 + os.getpid() % 200)
    yield made
    made.close()


@needs_etcd
def test_three_keepers_agree_on_one_generation_in_etcd_and_a_one_sided_partition_settles_on_one(cluster):
    cluster.rounds(6)
    agreed = cluster.keepers["a"].consensus.agreement.current().generation
    assert agreed.members == ("a", "b", "c") and not agreed.pending
    assert all(k.generation == agreed for k in cluster.keepers.values())
    assert all(run_pids(str(d)) for d in cluster.dirs.values())  # every host's ranks started
    cluster.cut = {frozenset("ab")}  # a and b lose each other; both still hear c
    cut = time.monotonic()
    c = cluster.keepers["c"].consensus.agreement
    while len(c.current().generation.members) == 3 and time.monotonic() - cut < 30:
        cluster.rounds(0.3)
    settled = time.monotonic() - cut
    cluster.rounds(10)  # and it stays settled
    after = [cluster.timeline(h) for h in HOSTS]
    changes = {g for t in after for g in t}
    assert len(changes) <= 3, changes  # the start, one generation without a or b (not dozens)
    final = cluster.keepers["c"].consensus.agreement.current().generation
    assert final.members in (("a", "c"), ("b", "c")), final
    outside = ({"a", "b"} - set(final.members)).pop()
    assert not run_pids(str(cluster.dirs[outside]))  # the host outside waits, its ranks stopped
    print(f"one-sided partition (a-b cut, both hear c): one generation {final.members} {settled:.1f} s after the "
          f"cut (lost after 3 s here), {len(changes)} generations in all")


@needs_etcd
def test_a_keeper_cut_off_from_etcds_majority_starts_no_ranks(cluster):
    cluster.rounds(5)
    before = cluster.keepers["a"].generation
    for host in ("b", "c"):  # two of three members gone: a's side has no majority
        consensus.stop_etcd_member(cluster.etcd.pop(host))
    for pid in run_pids(str(cluster.dirs["a"])):
        os.kill(pid, signal.SIGKILL)  # a's ranks die: with etcd it would be restarted
    k = cluster.keepers["a"]
    k.consensus.agreement.etcd.timeout_s = 0.5
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        k.step()
        time.sleep(0.3)
    assert not k.consensus.agreed_now and k.generation == before
    assert not run_pids(str(cluster.dirs["a"]))
    with pytest.raises(agreement.Unavailable):
        k.consensus.agreement.current()


def test_an_odd_number_of_members_on_the_runs_first_hosts_on_the_cluster_network():
    assert [len(agreement.members(list("abcdefgh"[:n]))) for n in range(3, 9)] == [3, 3, 5, 5, 5, 5]
    assert not agreement.uses_etcd(["a", "b"]) and agreement.uses_etcd(["a", "b", "c"])
    argv = agreement.member_command({**spec({h: Path("/d") for h in HOSTS}, "b", 29600), "run_id": "run-7"}, "/d/etcd")
    said = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert said["--listen-client-urls"] == "http://127.0.0.2:29601"
    assert said["--initial-cluster"] == "a=http://127.0.0.1:29602,b=http://127.0.0.2:29602,c=http://127.0.0.3:29602"
    assert said["--initial-cluster-token"] == "tandem-run-7-s1"  # a cluster of its own each start


@needs_etcd
def test_a_member_whose_data_is_gone_rejoins_the_runs_etcd_as_a_new_member(cluster):
    """A new VM in c's place (its /data empty) while a and b keep the run's cluster: c's member is removed
    and added anew through them, and it serves again (issue 52, 3: before, its etcd exited "already
    bootstrapped" or formed a cluster of its own, and the run had no margin left)."""
    cluster.rounds(4)
    consensus.stop_etcd_member(cluster.etcd.pop("c"))
    kdir = cluster.dirs["c"] / "keeper"
    shutil.rmtree(kdir / "etcd")
    s = spec(cluster.dirs, "c", cluster.keepers["c"].spec["port"])
    said: list[str] = []
    files.LISTENER = said.append
    try:
        for _ in range(3):  # the keeper's loop asks again every 10 s while its member does not run
            cluster.etcd["c"] = consensus.etcd_member(str(cluster.dirs["c"]), s)
            if cluster.etcd["c"]:
                break
            time.sleep(2)
    finally:
        files.LISTENER = None
    assert any("joins the run's cluster as a new member" in line for line in said), (said, agreement.ask_members(s))
    only_c = agreement.Etcd([agreement.client_url(s, "c")], timeout_s=2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            listed = only_c.member_list()
            only_c.get(agreement.GENERATION)  # a linearizable read: c is a voting member again
            break
        except agreement.Unavailable:
            time.sleep(0.3)
    else:
        pytest.fail(f"c's new member never served: {(kdir / 'etcd.log').read_text()[-2000:]}")
    assert sorted(m["name"] for m in listed) == ["a", "b", "c"] and all(m.get("clientURLs") for m in listed)
    for host in ("a", "b"):  # c carries the majority with either of the others
        consensus.stop_etcd_member(cluster.etcd.pop(host))
        try:
            assert cluster.keepers["c"].consensus.agreement.current().generation is not None
        finally:
            cluster.etcd[host] = consensus.etcd_member(str(cluster.dirs[host]), spec(cluster.dirs, host,
                                                                                      cluster.keepers[host].spec["port"]))
            time.sleep(2)


def test_a_member_without_data_never_bootstraps_a_cluster_of_its_own_beside_the_runs(monkeypatch, tmp_path):
    """The run's cluster answers but does not take c as a new member yet (no majority heard for 5 s):
    c starts no etcd of its own (it would form a second cluster beside the run's); its keeper tries later."""
    s = spec({h: tmp_path / h for h in HOSTS}, "c", 29640)
    c = agreement.peer_url(s, "c")
    monkeypatch.setattr(agreement.Etcd, "member_list",
                        lambda self: [{"ID": "7", "name": "c", "peerURLs": [c], "clientURLs": ["http://x"]}])
    monkeypatch.setattr(agreement.Etcd, "member_remove", lambda self, member_id: None)

    def refuse(self, peer):
        raise agreement.Unavailable("HTTP 503 Service Unavailable")

    monkeypatch.setattr(agreement.Etcd, "member_add", refuse)
    monkeypatch.setattr(agreement.Etcd, "get", lambda self, key: (None, 0))  # a majority answers
    monkeypatch.setattr(agreement, "ADD_TRIES", 2)
    monkeypatch.setattr(agreement.time, "sleep", lambda s: None)
    with pytest.raises(agreement.Unavailable, match="did not take this host"):
        agreement.how_to_join(s, has_data=False)
    run_dir = tmp_path / "c" / "r1"
    (run_dir / "keeper").mkdir(parents=True)
    if shutil.which("etcd"):
        assert consensus.etcd_member(str(run_dir), s) is None and not (run_dir / "keeper" / "etcd.pid").exists()


def test_the_members_follow_the_hosts_one_loss_after_another():
    """Which change the leader makes (etcd.next_change): a member unheard for long gives its place to a
    live host; never two changes while an added member has not started; never an add that leaves the
    started members short of a majority; never fewer than three members."""
    order = list("abcdefgh")
    started = dict.fromkeys("abcde", True)
    assert agreement.next_change(started, set("bcdefgh"), {"a"}, order, 5) == ("a", "f")
    assert agreement.next_change({**dict.fromkeys("bcde", True), "f": False}, set("cdefgh"), {"b"}, order, 5) == \
        (None, None)  # f not started yet: b waits
    assert agreement.next_change(dict.fromkeys("abc", True), set("bc"), {"a"}, list("abc"), 3) == (None, None)
    # three of five gone at once: no change can pass (etcd would refuse it without a majority anyway)
    assert agreement.next_change(started, set("defgh"), set("abc"), order, 5) == ("a", None)
    assert agreement.next_change(dict.fromkeys("abcd", True), set("abcde"), set(), order, 5) == (None, "e")


def etcd_up(client: agreement.Etcd, timeout_s: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = client.member_list()
            client.get(agreement.GENERATION)  # linearizable: a majority behind it
            return listed
        except agreement.Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@needs_etcd
def test_a_lost_members_place_goes_to_a_live_host_and_the_returning_one_stays_out(tmp_path):
    """Four hosts, etcd on a, b, c (a real etcd 3.4 on loopback). c's host is lost: the leader's follow
    removes c's member and adds d; d's keeper asks etcd, finds itself added and joins; a, b, d carry the
    agreement (b lost next: a, d still a majority). c back with its old data: etcd no longer lists it and
    its keeper starts no member (before, members were the run's first three for good: issue 52, 3)."""
    hosts = {"a": "127.0.0.1", "b": "127.0.0.2", "c": "127.0.0.3", "d": "127.0.0.4"}
    port = 29500 + os.getpid() % 150
    base = {"run_id": "rf", "order": list(hosts), "members": list(hosts), "addresses": hosts, "port": port,
            "start": "s1", "lost_after_s": 3}
    specs = {h: {**base, "me": h} for h in hosts}
    dirs = {h: tmp_path / h / "r1" for h in hosts}
    pids = {}
    try:
        for h in hosts:
            (dirs[h] / "keeper").mkdir(parents=True)
        for h in "abc":
            pids[h] = consensus.etcd_member(str(dirs[h]), specs[h])
        assert consensus.etcd_member(str(dirs["d"]), specs["d"]) is None  # d: no member yet
        etcd_up(agreement.Etcd([agreement.client_url(specs["a"], "a")]))
        consensus.stop_etcd_member(pids.pop("c"))
        leader, said = agreement.Agreement(specs["a"]), []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("d added" in line for line in said):
            said.append(leader.follow(live={"a", "b", "d"}, gone={"c"}) or "")
            time.sleep(1)  # the leader's round; etcd refuses a change until its leader heard a majority for 5 s
        assert any("c's member removed" in line for line in said) and "d added as a member" in said[-1], said
        pids["d"] = consensus.etcd_member(str(dirs["d"]), specs["d"])
        assert pids["d"], (dirs["d"] / "keeper" / "etcd.log").read_text()[-2000:]
        listed = etcd_up(agreement.Etcd([agreement.client_url(specs["d"], "d")]))
        assert sorted(m["name"] for m in listed) == ["a", "b", "d"]
        consensus.stop_etcd_member(pids.pop("b"))
        assert agreement.Agreement(specs["d"]).current().generation is None  # a and d: still a majority
        assert consensus.etcd_member(str(dirs["c"]), specs["c"]) is None  # back, its data there: not a member
    finally:
        for pid in pids.values():
            if pid:
                consensus.stop_etcd_member(pid)

