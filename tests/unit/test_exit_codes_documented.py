"""The README's exit-code table lists every status a fab task ends with (train.errors, and 130 for Ctrl-C from
train.cli.executor), the same codes as docs/cli.md's table."""

from __future__ import annotations

import re
from pathlib import Path

from train import errors
from train.cli import executor

TOP = Path(__file__).resolve().parents[2]


def table_codes(text: str, heading: str) -> dict[int, str]:
    """{code: meaning} of the first table after `heading`: its rows, up to the first line that is not one."""
    lines = text.split(heading, 1)[1].splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("|")):]
    rows = lines[:next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    return {int(m[1]): m[2].strip() for row in rows if (m := re.match(r"\| (\d+) \| ([^|]+) \|", row))}


def test_the_readme_table_lists_every_exit_status_fab_ends_with():
    ends = {errors.DONE, errors.FAILED, errors.BAD_INPUT, errors.REFUSED, executor.INTERRUPTED}
    readme = table_codes((TOP / "README.md").read_text(), "Exit codes, the same in every task:")
    assert set(readme) == ends
    assert readme[130].startswith("interrupted")
    assert set(table_codes((TOP / "docs/cli.md").read_text(), "## Exit codes")) == ends
