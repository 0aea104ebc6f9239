"""`fab prepare-data` on the cluster: rank 0's host prepares, the others get the dataset host to host;
the controller's link carries commands and progress only. Each case a dataset of its own (small)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from labtools import FAB, TOP, as_at_a_terminal, fab, ssh

from benchmarks import wmt16_mirror
from benchmarks.prepare_lab import bridge_bytes
from train.agent.data import synthetic

DATA = "/data/tandem/datasets"


def manifest_sums(cfg, name: str) -> dict[str, str]:
    return {h: ssh(cfg, h, f"sha256sum {DATA}/{name}/MANIFEST.sha256").stdout.split()[0] for h in cfg.names}


def forget(cfg, name: str) -> None:
    for host in cfg.names:
        ssh(cfg, host, f"rm -rf {DATA}/{name} /data/tandem/prepare/{name}")


def test_rank0_prepares_the_others_copy_from_it_and_the_controller_carries_little(provisioned):
    cfg, name = provisioned.cfg, "lab-small"
    forget(cfg, name)
    try:
        before = bridge_bytes(cfg)
        out = fab(provisioned, "prepare-data", "--name", name, "--lines", "3000").stdout
        through = bridge_bytes(cfg) - before
        print(out)
        print(f"through the controller's side of the bridge: {through / 1e6:.2f} MB")
        assert f"preparing {name} on v100a" in out and "identical on every host (v100a, v100b)" in out
        sums = manifest_sums(cfg, name)
        assert len(set(sums.values())) == 1, sums
        dataset = int(ssh(cfg, "v100b", f"du -sb {DATA}/{name}").stdout.split()[0])
        assert through < 10e6 and through < dataset, (through, dataset)
        # the same again: nothing built, nothing copied
        again = fab(provisioned, "prepare-data", "--name", name, "--lines", "3000").stdout
        assert "stages built now: none" in again and "nothing copied" in again, again
    finally:
        forget(cfg, name)


def test_an_interrupted_preparation_resumes_from_its_last_finished_stage(provisioned):
    cfg, name = provisioned.cfg, "lab-resume"
    forget(cfg, name)
    env = {"FABRIC_INVENTORY": str(provisioned.inventory), "COLUMNS": "200"}
    try:
        proc = subprocess.Popen([FAB, "prepare-data", "--name", name, "--lines", "60000"], cwd=TOP,
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=as_at_a_terminal)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # wait for the first finished stage on rank 0's host
            if ssh(cfg, "v100a", f"ls /data/tandem/prepare/{name}/.text.done").returncode == 0:
                break
            time.sleep(1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C on the controller
        proc.wait(timeout=60)
        time.sleep(3)  # the host's runner dies on its closed output
        assert proc.returncode != 0
        for host in cfg.names:  # nothing published, on either host
            assert ssh(cfg, host, f"test -e {DATA}/{name}").returncode != 0, host
        out = fab(provisioned, "prepare-data", "--name", name, "--lines", "60000").stdout
        built = re.search(r"stages built now: (.*); already done: (.*)", out)
        assert built and "text" in built[2] and "raw" in built[2] and "bin" in built[1], out
        assert "identical on every host (v100a, v100b)" in out
    finally:
        forget(cfg, name)


def test_a_receiver_without_room_is_refused_before_the_copy_naming_it(provisioned):
    cfg, name = provisioned.cfg, "lab-full"
    forget(cfg, name)
    fill = "/data/tandem/fill"
    try:  # v100b's /data (its own volume) left with 100 kB free
        free = int(ssh(cfg, "v100b", "df -PB1 /data | awk 'NR==2 {print $4}'").stdout)
        assert ssh(cfg, "v100b", f"fallocate -l {free - 100_000} {fill}").returncode == 0
        out = fab(provisioned, "prepare-data", "--name", name, "--lines", "3000", check=False)
        said = out.stdout + out.stderr
        assert out.returncode != 0
        assert re.search(r"v100b: not enough disk for the dataset in /data/tandem/datasets: needs 0\.\d MB, "
                         r"0\.\d MB free", said), said
        assert ssh(cfg, "v100b", f"test -e {DATA}/{name}").returncode != 0
    finally:
        ssh(cfg, "v100b", f"rm -f {fill}")
        forget(cfg, name)


def test_wmt16_from_a_mirror_on_the_labs_bridge_downloaded_by_rank0s_host(provisioned, tmp_path):
    """The real download code on v100a (resumable, checksummed) against a WMT16-shaped mirror served on
    the lab's bridge: the archives' real names and layout, a small generated corpus."""
    cfg, name = provisioned.cfg, "lab-wmt16"
    forget(cfg, name)
    ssh(cfg, "v100a", "rm -rf /data/tandem/prepare/downloads")
    wmt16_mirror.build(tmp_path / "mirror", pairs=6000)
    archives = sum(p.stat().st_size for p in (tmp_path / "mirror").iterdir())
    httpd, url = wmt16_mirror.serve(tmp_path / "mirror", bind=cfg.bridge_ip)
    try:
        before = bridge_bytes(cfg)
        out = subprocess.run([FAB, "prepare-data", "--wmt16", "--name", name, "--vocab-size", "600"], cwd=TOP,
                             env={**os.environ, "FABRIC_INVENTORY": str(provisioned.inventory), "COLUMNS": "200",
                                  "TANDEM_WMT16_MIRROR": url}, capture_output=True, text=True, timeout=900)
        through = bridge_bytes(cfg) - before - archives  # the mirror runs on this machine: not the controller's
        print(out.stdout, out.stderr)
        print(f"through the controller (bridge bytes less the archives served): {through / 1e6:.2f} MB")
        assert out.returncode == 0
        assert "download training-parallel-europarl-v7.tgz" in out.stdout
        assert "identical on every host (v100a, v100b)" in out.stdout
        assert through < 10e6
        refs = {h: ssh(cfg, h, f"wc -l < {DATA}/{name}/test.ref.de").stdout.strip() for h in cfg.names}
        assert refs == {"v100a": "3003", "v100b": "3003"}  # newstest2014's segments
    finally:
        httpd.shutdown()
        httpd.server_close()
        forget(cfg, name)
        ssh(cfg, "v100a", "rm -rf /data/tandem/prepare/downloads")


def test_a_corpus_on_the_controller_is_uploaded_once_to_rank0s_host_then_spread(provisioned, tmp_path):
    cfg, name = provisioned.cfg, "lab-source"
    forget(cfg, name)
    source = tmp_path / name
    # a user's corpus directory (generated: a clean clone has nothing beside it to read)
    synthetic.write_corpus(source, train=4000, valid=300, test=300)
    uploaded = sum(p.stat().st_size for p in source.iterdir())
    try:
        before = bridge_bytes(cfg)
        out = fab(provisioned, "prepare-data", "--source", str(source), "--vocab-size", "2000").stdout
        through = bridge_bytes(cfg) - before
        print(out)
        print(f"corpus {uploaded / 1e6:.2f} MB; through the controller's side of the bridge {through / 1e6:.2f} MB")
        assert "identical on every host (v100a, v100b)" in out
        dataset = int(ssh(cfg, "v100b", f"du -sb {DATA}/{name}").stdout.split()[0])
        # the corpus once, to v100a, plus commands and progress: not the dataset to each host
        assert through < uploaded * 1.2 + 200_000, (through, uploaded, dataset)
        assert ssh(cfg, "v100b", f"test -e /data/tandem/sources/{name}").returncode != 0  # only rank 0's host has it
    finally:
        forget(cfg, name)
        ssh(cfg, "v100a", f"rm -rf /data/tandem/sources/{name}")
