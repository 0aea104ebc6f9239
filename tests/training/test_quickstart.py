"""The README's quickstart ("Your machines in 15 minutes"), run as written on the lab, the lab standing
in for a user's two VMs: every command of its console blocks, in order, each one's output checked
against the lines the README shows under it. A README that drifts from what tandem prints fails here.

What the lab changes, and only this (lab_stands_in): the VMs' addresses, login user and key are the
lab's (its known_hosts too); `fab init` writes its inventory to a temporary file, with the lab's 1 GB
free-space floor (its data disks have 4 GB), and the commands after it use the lab's
inventory (which adds the lab's offline apt repository and wheelhouse); WMT16 comes from a
WMT16-shaped mirror on the lab's bridge (TANDEM_WMT16_MIRROR, 6000 pairs, a 1000-piece vocabulary);
the lab has CPUs, not V100s, so the big preset becomes `tiny`, for 40 updates; `fab stop` waits for the
run's first checkpoint, which `fab evaluate` reads. `git clone` and
`make setup` are the session's own (tests/training/test_laptop_controller.py runs `make setup` as
a user who is not root); each command after them runs in a login shell after `source .venv/bin/activate`,
where step 1 leaves the user.

How an output is checked: each line the README shows must be a line of the real output once
numbers, sizes and times are masked (`#`) and spaces collapsed; a line `...` stands for any lines, ` ... `
within a line for any text."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time

import pytest
from labtools import TOP, ssh

from benchmarks import wmt16_mirror
from train.recipe.record import Run

SECTION = "## Your machines in 15 minutes"
SKIPPED = ("git clone", "make setup")  # the session's checkout and .venv


def console_blocks(readme: str) -> list[list[tuple[str, list[str]]]]:
    """The section's ```console blocks, each a list of (command, the output lines shown)."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps and line.strip():
                steps[-1][1].append(line)
        blocks.append(steps)
    return blocks


def masked(line: str) -> str:
    """Figures (and their units) as `#`, spaces collapsed: what differs between two hosts' runs."""
    line = re.sub(r"\d+([.,:]\d+)*(\s?(kB|MB|GB|TB|ms|s|min|h)\b)?", "#", line)
    return " ".join(line.split())


def matches(want: str, real: str) -> bool:
    """`want`'s parts between ` ... ` appear in `real`, in order."""
    at = 0
    for part in (p.strip() for p in want.split("...")):
        found = real.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def shown_in(shown: list[str], output: str) -> list[str]:
    """The README's lines missing from `output`, in order (a line `...`: any lines; ` ... ` in a line: any
    text)."""
    real = [masked(line) for line in output.splitlines()]
    missing, at = [], 0
    for line in shown:
        if line.strip() == "...":
            continue
        want = masked(line)
        found = next((i for i in range(at, len(real)) if matches(want, real[i])), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


@pytest.fixture(scope="module")
def mirror(provisioned, tmp_path_factory):
    where = tmp_path_factory.mktemp("wmt16-mirror")
    wmt16_mirror.build(where, pairs=6000)
    httpd, url = wmt16_mirror.serve(where, bind=provisioned.cfg.bridge_ip)
    yield url
    httpd.shutdown()
    httpd.server_close()


def lab_stands_in(provisioned, scratch) -> list[tuple[str, str]]:
    cfg = provisioned.cfg
    addresses = ",".join(cfg.host_ip(name) for name in cfg.names)
    return [
        ("203.0.113.10,203.0.113.11", addresses),
        ("--user ubuntu", f"--user {cfg.login_user}"),
        ("--key ~/.ssh/id_ed25519", f"--key {cfg.key} --known-hosts {cfg.known_hosts}"),
        # the lab's 4 GB data disks: the 1 GB provisioning asks of a lab host (roles/data_volume)
        ("--out inventory/mine.yml", f"--out {scratch / 'mine.yml'} --vars data_volume_min_free_gb=1"),
        ("-i inventory/mine.yml", f"-i {provisioned.inventory}"),
        ("--preset transformer_vaswani_wmt_en_de_big", "--preset tiny --set max_update=40"),
        ("--wmt16", "--wmt16 --vocab-size 1000"),
    ]


def activated(argv: list[str]) -> list[str]:
    """argv run as step 1 leaves the user: in a login shell, after `source .venv/bin/activate`."""
    return ["bash", "-lc", 'cd "$0" && source .venv/bin/activate && exec "$@"', str(TOP), *argv]


def test_the_readmes_quickstart_runs_as_written_on_the_lab(provisioned, mirror, tmp_path):
    cfg = provisioned.cfg
    readme = (TOP / "README.md").read_text()
    blocks = console_blocks(readme)
    assert len(blocks) >= 6, "the quickstart's console blocks"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {
        "COLUMNS": "200", "TANDEM_WMT16_MIRROR": mirror}
    for host in cfg.names:
        ssh(cfg, host, "rm -rf /data/tandem/datasets/wmt16 /data/tandem/prepare/wmt16")
    stands_in = lab_stands_in(provisioned, tmp_path)
    ran = []
    try:
        for steps in blocks:
            for command, shown in steps:
                if command.startswith(SKIPPED):
                    continue
                real = command
                for words, lab in stands_in:
                    real = real.replace(words, lab)
                if real.startswith("fab stop"):  # stop once the run holds a checkpoint to evaluate
                    wait_for_a_checkpoint(cfg)
                started = time.monotonic()
                done = subprocess.run(activated(shlex.split(real)), cwd=TOP, env=env, capture_output=True,
                                      text=True, timeout=900)
                output = done.stdout + done.stderr
                ran.append(f"{command}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
                print(f"$ {real}\n{output}")
                assert done.returncode == 0, f"{command}\n{output[-4000:]}"
                missing = shown_in(shown, output)
                assert not missing, f"`{command}` no longer prints, as the README shows:\n" + "\n".join(missing) \
                    + f"\n--- it printed:\n{output[-4000:]}"
                if command.startswith("fab init"):  # fab reads the inventory init wrote from here on: the lab's,
                    env["FABRIC_INVENTORY"] = str(provisioned.inventory)  # beside init's file, stands in for it
    finally:
        print("\n".join(ran))
        subprocess.run(activated(["fab", "stop"]), cwd=TOP, env=env, capture_output=True, timeout=120)
    assert any(c.startswith("fab train") for c in ran) and any(c.startswith("fab report") for c in ran)


def wait_for_a_checkpoint(cfg, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    run = Run.load(None)  # the run fab train started or resumed: the controller's latest
    while time.monotonic() < deadline:
        if ssh(cfg, cfg.names[0], f"test -s {run.remote_dir}/checkpoints/checkpoint_best.pt").returncode == 0:
            return
        time.sleep(3)
    raise AssertionError("no checkpoint on rank 0's host within 5 minutes")
