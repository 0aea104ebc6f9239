"""A start resolved once (train.run.start): what `fab train` says of its batch and length, and the
commands, the interval and the disk need every later step reads from it."""

from __future__ import annotations

from train.cluster import Host
from train.plan.batching import VOCAB
from train.recipe import presets
from train.recipe.record import Run
from train.run import disk, keepers, launch, start


def cpu(name: str, ranks: int = 1) -> Host:
    return Host(name, f"10.0.0.{11 + ord(name[-1]) - ord('a')}",
                vars={"network_expected_mbps": 1000, "cpu_ranks": ranks})


def test_the_runs_batch_comes_from_its_preset_and_hosts():
    run = Run(run_id="r1", hosts=["v100a", "v100b"], preset="tiny", overrides=["max_tokens=1024"],
              dataset="synthetic", update_freq=2)
    assert start.resolve(run, [cpu("v100a", 2), cpu("v100b", 2)], None, read_log=False).batch_line() == (
        "batch 2 hosts x 2 ranks x 1,024 tokens x update-freq 2 = 8,192 tokens per update")
    assert presets.resolve("tiny").options["max_tokens"] == 2048


def test_a_runs_length_is_its_batch_on_its_hosts():
    hosts = [Host("v100a", "10.10.0.1"), Host("v100b", "10.10.0.2")]
    run = Run(run_id="r", hosts=["v100a", "v100b"], preset="tiny", overrides=[], dataset="synthetic", update_freq=2)
    assert start.resolve(run, hosts, None, read_log=False).length(1_000_000) == (
        "8,192 tokens per update x 300 updates = 2.5 M tokens ≈ 2.5 epochs of synthetic (1.0 M tokens)")


def test_the_start_holds_what_the_keepers_run_and_preflight_checks():
    hosts = [cpu("v100a"), cpu("v100b")]
    run = Run(run_id="r", hosts=["v100a", "v100b"], preset="tiny", overrides=["max_update=1000"],
              dataset="synthetic")
    resolved = start.resolve(run, hosts, None, read_log=False)
    assert run.save_interval_updates == 50 and resolved.saves.every == 50  # the interval, chosen and set on the run
    assert resolved.commands == launch.host_commands(run, hosts)
    assert keepers.spec(run, hosts, commands=resolved.commands)["commands"]["v100a,v100b"] == resolved.commands
    assert resolved.disk_need == disk.run_need(run.resolved_preset().options, VOCAB)
    assert (resolved.max_update, resolved.tokens_per_update) == (1000, 4096)
    assert resolved.said(None).startswith("batch 2 hosts x 1 rank x 2,048 tokens x update-freq 1 = 4,096 tokens "
                                          "per update; 4,096 tokens per update x 1,000 updates = 4.1 M tokens")
