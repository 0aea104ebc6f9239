"""The sampler beside the training: what it watches and what it refuses."""

from __future__ import annotations

import json
import sys

from train.agent import monitor


def test_it_follows_the_run_by_its_save_dir_and_writes_samples(tmp_path, spawn):
    save_dir = str(tmp_path / "checkpoints")
    spawn([sys.executable, "-c", "import time; time.sleep(3)", "--save-dir", save_dir])
    assert monitor.run_alive(save_dir) and not monitor.run_alive(save_dir + "-other")
    out = tmp_path / "samples.jsonl"
    assert monitor.main(["--out", str(out), "--nic", "lo", "--watch", save_dir, "--interval", "0.5"]) == 0
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(samples) >= 2 and all(s["nic"] == "lo" and s["tx_Bps"] >= 0 for s in samples)
    assert samples[0]["gpus"] is None  # no NVML here: absent, not 0


def test_a_nic_the_host_lacks_is_named_not_sampled_silently(tmp_path, capsys):
    code = monitor.main(["--out", str(tmp_path / "s.jsonl"), "--nic", "ens99", "--watch", str(tmp_path)])
    assert code == 2 and "no NIC ens99 to sample" in capsys.readouterr().err
    assert not (tmp_path / "s.jsonl").exists()
