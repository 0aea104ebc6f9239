"""Helpers of the tests on the lab of three hosts (tests/training/conftest.py's `three_hosts`)."""

from __future__ import annotations

import json
import shlex
import time

from labtools import fab, ssh
from test_train import QUICK_HEARTBEAT, RUNS


def start_on_three(three_hosts, name: str, settings: str = "") -> str:
    """A detached run of the three hosts (the dataset prepared on each), saving every 25 updates;
    `settings`: more of `--set`'s."""
    run_id = time.strftime(f"run-{name}-%Y%m%d-%H%M%S")
    assert "identical on every host" in fab(three_hosts, "prepare-data").stdout
    fab(three_hosts, "train", "--new", "--detach", "--run", run_id, "--set",
        f"max_update=100000,save_interval_updates=25,{QUICK_HEARTBEAT}" + (f",{settings}" if settings else ""))
    return run_id


def keeper_timeline(cfg, host: str, run_id: str) -> list[dict]:
    out = ssh(cfg, host, f"cat {RUNS}/{run_id}/keeper/timeline.jsonl").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


STRANGER = ("import ssl, sys, urllib.error, urllib.request\n"
            "anyone = ssl.create_default_context(); anyone.check_hostname = False; anyone.verify_mode = ssl.CERT_NONE\n"
            "put = b'{\"key\": \"Z2VuZXJhdGlvbg==\", \"value\": \"eA==\"}'  # generation = x\n"
            "for url, body in ((sys.argv[1], None), (sys.argv[2], put)):\n"
            "    for tried in (url, url.replace('https://', 'http://')):\n"
            "        try:\n"
            "            urllib.request.urlopen(urllib.request.Request(tried, data=body), timeout=5, context=anyone)\n"
            "            print('answered', tried)\n"
            "        except urllib.error.HTTPError as err:\n"
            "            print('answered', tried, err.code)\n"
            "        except Exception as err:\n"
            "            print('refused', tried, err)\n")


def asked_without_certificate(cfg, from_host: str, to_host: str, port: int = 29600) -> str:
    """What `from_host` (a peer the firewall lets through) gets asking `to_host`'s keeper for its state and
    writing `generation` to its etcd member without a certificate of the run's CA, over TLS and plain
    HTTP: a line each, `refused URL why` or `answered URL`."""
    keeper = f"https://{cfg.cluster_ip(to_host)}:{port}/state"
    etcd = f"https://{cfg.cluster_ip(to_host)}:{port + 1}/v3/kv/put"
    return ssh(cfg, from_host, f"python3 -c {shlex.quote(STRANGER)} {keeper} {etcd}").stdout

