"""The recipe's batch on every cluster (issue 28): one preset batch, 4,096 tokens per update (tiny with
`--set tokens_per_update=4096`), trained a few updates on 1 host, 2 hosts and 2 hosts x 2 ranks. fab train
derives max_tokens and update_freq for each (1 x 2,048 x 2; 2 x 2,048 x 1; 4 x 1,024 x 1) and fairseq's
log shows the same tokens per update on all three."""

from __future__ import annotations

import re
import statistics
import time

import pytest
from labtools import fab
from test_train import inner_records, log_of

TARGET = 4096
SETTINGS = f"tokens_per_update={TARGET},max_update=6,log_interval=1,heartbeat_timeout=20"
LAYOUTS = {"1 host": ("v100a", 2048, 2), "2 hosts": ("v100a,v100b", 2048, 1)}
logged: dict[str, float] = {}  # per layout: fairseq's median wpb (target tokens an update, every rank and batch)


def train_and_read(provisioned, hosts: str, max_tokens: int, update_freq: int) -> float:
    run_id = time.strftime(f"run-batch-{hosts.count(',') + 1}h-%H%M%S")
    dry = fab(provisioned, "--hosts", hosts, "train", "--new", "--run", run_id, "--set", SETTINGS, "--dry-run").stdout
    assert f"--max-tokens {max_tokens} " in dry and "--tokens-per-update" not in dry, dry[-3000:]
    assert (f"--update-freq {update_freq} " in dry) == (update_freq > 1), dry[-3000:]
    derived = re.search(r"batch derived: the recipe's 4,096 tokens per update = (\d+) ranks x ([\d,]+) max_tokens x "
                        r"update-freq (\d+) \(([\d,]+), ([+-][\d.]+)%", dry)
    assert derived, dry[-3000:]
    assert int(derived.group(4).replace(",", "")) == max_tokens * update_freq * int(derived.group(1))
    assert abs(float(derived.group(5))) <= 5
    out = fab(provisioned, "--hosts", hosts, "train", "--new", "--run", run_id, "--set", SETTINGS, columns=None).stdout
    assert "batch derived: the recipe's 4,096 tokens per update" in out, out[-3000:]
    records = [r for r in inner_records(log_of(provisioned.cfg, hosts.split(",")[0], run_id)) if "wpb" in r]
    assert len(records) >= 4, records
    return statistics.median(float(r["wpb"]) for r in records)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_and_two_hosts_train_with_the_recipes_tokens_per_update(data_ready, layout):
    hosts, max_tokens, update_freq = LAYOUTS[layout]
    logged[layout] = train_and_read(data_ready, hosts, max_tokens, update_freq)
    print(f"{layout}: {max_tokens} max_tokens x update-freq {update_freq}: fairseq's wpb {logged[layout]:.0f}")
    # wpb counts the target's real tokens; max_tokens the padded longer side: the batch fills ~85-95% of it
    assert 0.80 * TARGET <= logged[layout] <= TARGET, logged


def test_two_by_two_ranks_train_with_the_same_tokens_per_update(two_by_two):
    wpb = train_and_read(two_by_two, "v100a,v100b", 1024, 1)
    print(f"2 x 2 ranks: 1024 max_tokens x update-freq 1: fairseq's wpb {wpb:.0f}; the others {logged}")
    assert 0.80 * TARGET <= wpb <= TARGET
    for layout, other in logged.items():  # the same batch everywhere: within 5% of each other
        assert abs(wpb / other - 1) <= 0.05, (layout, other, wpb)
