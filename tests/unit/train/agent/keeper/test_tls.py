"""The run's mutual TLS (train.run.tls makes the certificates, train.agent.keeper.tls uses them): the
keepers' heartbeat and a real etcd 3.4 cluster on loopback answer only a peer holding a certificate of
the run's CA. A stranger on the cluster network, or a host of another run, reads and writes nothing."""

from __future__ import annotations

import os
import shutil
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from train.agent.keeper import consensus, heartbeat, tls
from train.agent.keeper import etcd as agreement
from train.run import tls as run_tls

HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2", "c": "127.0.0.3"}


def certified(tmp_path: Path, run_id: str = "r-tls") -> dict[str, dict]:
    """Each host's spec, its certificate of the run's CA in its own tls folder (0600)."""
    ca = run_tls.run_ca(run_id, tmp_path / "controller")
    port = 29300 + os.getpid() % 150
    specs = {}
    for host, address in HOSTS.items():
        where = tmp_path / host / "keeper" / "tls"
        where.mkdir(parents=True)
        for name, data in run_tls.host_files(ca, host, address).items():
            (where / name).write_bytes(data)
            os.chmod(where / name, 0o600)
        specs[host] = {"run_id": run_id, "me": host, "order": list(HOSTS), "members": list(HOSTS),
                       "addresses": HOSTS, "port": port, "token": "t", "start": "s1", "tls_dir": str(where)}
    return specs


def stranger(tmp_path: Path) -> ssl.SSLContext:
    """A client holding a certificate of another run's CA (trusting ours, to get as far as it can)."""
    other = run_tls.run_ca("another", tmp_path / "other")
    files = run_tls.host_files(other, "x", "127.0.0.9")
    for name, data in files.items():
        (tmp_path / f"x-{name}").write_bytes(data)
    context = ssl.create_default_context(cafile=str(tmp_path / "a" / "keeper" / "tls" / "ca.crt"))
    context.load_cert_chain(str(tmp_path / "x-host.crt"), str(tmp_path / "x-host.key"))
    return context


def test_the_ca_key_stays_on_the_controller_0600_and_each_host_gets_its_own_certificate(tmp_path):
    specs = certified(tmp_path)
    controller = tmp_path / "controller"
    assert controller.stat().st_mode & 0o777 == 0o700 and (controller / "ca.key").stat().st_mode & 0o777 == 0o600
    assert run_tls.run_ca("r-tls", controller)[1].serial_number == run_tls.run_ca("r-tls", controller)[1].serial_number
    assert not any((tmp_path / h / "keeper" / "tls" / "ca.key").exists() for h in HOSTS)
    assert tls.scheme(specs["a"]) == "https" and tls.scheme({**specs["a"], "tls_dir": None}) == "http"


def test_a_keepers_heartbeat_answers_its_peers_and_refuses_a_stranger(tmp_path):
    specs = certified(tmp_path)
    server = heartbeat.serve(specs["a"], str(tmp_path / "a"), lambda: {"host": "a"}, lambda: False)
    try:
        url = f"https://127.0.0.1:{specs['a']['port']}/state"
        request = urllib.request.Request(url, headers={"X-Tandem-Token": "t"})
        with urllib.request.urlopen(request, timeout=5, context=tls.client_context(specs["b"])) as answer:
            assert answer.status == 200  # b, a host of the run
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(request, timeout=5, context=stranger(tmp_path))  # another run's certificate
        no_certificate = ssl.create_default_context(cafile=str(tmp_path / "a" / "keeper" / "tls" / "ca.crt"))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(request, timeout=5, context=no_certificate)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: the token never in cleartext
            urllib.request.urlopen(f"http://127.0.0.1:{specs['a']['port']}/state", timeout=5)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd-server is not installed (make test-setup)")
def test_the_runs_etcd_takes_writes_from_its_hosts_only(tmp_path):
    """Three members over TLS, peers and clients alike: a host of the run writes the generation; a curl
    without a certificate and a client of another run are refused (issue 54: one plain PUT of
    `generation` made every keeper stop)."""
    specs = certified(tmp_path)
    pids = {}
    try:
        for host, spec in specs.items():
            run_dir = tmp_path / host
            pids[host] = consensus.etcd_member(str(run_dir), spec)
        ours = agreement.Etcd([agreement.client_url(specs["a"], "a")], context=tls.client_context(specs["a"]))
        deadline = time.monotonic() + 30
        while True:
            try:
                assert ours.put_if("probe", "1", 0)
                break
            except agreement.Unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        url = agreement.client_url(specs["a"], "a")
        assert url.startswith("https://")
        put = urllib.request.Request(f"{url}/v3/kv/put", data=b'{"key": "Z2VuZXJhdGlvbg==", "value": "eA=="}')
        anyone = ssl.create_default_context()
        anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE  # as `curl -k` would
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(put, timeout=5, context=anyone)  # no certificate: refused
        theirs = agreement.Etcd([url], timeout_s=2, context=stranger(tmp_path))
        with pytest.raises(agreement.Unavailable):
            theirs.put_if("generation", "x", 0)
        assert ours.get("generation") == (None, 0)  # nothing a stranger wrote
    finally:
        for pid in pids.values():
            if pid:
                consensus.stop_etcd_member(pid)


def test_a_keeper_waits_for_the_last_keeper_lingering_on_its_port_instead_of_crashing(tmp_path):
    """A new start's keeper while the run's last keeper still answers its peers on the heartbeat port for a
    few seconds: it waits for the port (CI, 29 Nov: it exited with `Address already in use` and its
    supervisor started it again and again, each a failed start toward its limit)."""
    import socket
    import threading

    specs = certified(tmp_path)
    lingering = socket.socket()
    lingering.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server's: past an earlier TIME_WAIT
    lingering.bind(("127.0.0.1", specs["a"]["port"]))
    lingering.listen()
    threading.Timer(1.5, lingering.close).start()
    started = time.monotonic()
    server = heartbeat.serve(specs["a"], str(tmp_path / "a"), lambda: {"host": "a"}, lambda: False)
    try:
        assert 1.0 < time.monotonic() - started < heartbeat.BIND_WAIT_S
    finally:
        server.shutdown()
        server.server_close()
