"""The docs against the repository and against the commands they quote, so that they cannot drift: every
relative link in README.md, docs/*.md and benchmarks/README.md leads to a file (and its #anchor to a
heading there); docs/layout.md names every module under train/, benchmarks/ and lab/, each in its folder,
and nothing that is gone; docs/benchmarks.md's cost table is what `python -m train.plan.compare` prints
now; the prediction's measured accuracy is quoted as benchmarks/README.md measured it; and every fab
task's first docstring line, what `fab -l` shows, is a whole sentence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
DOCS = [TOP / "README.md", *sorted((TOP / "docs").glob("*.md")), TOP / "benchmarks" / "README.md"]
FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the text may hold one level of brackets and run over lines.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def unfenced(path: Path) -> list[str]:
    """The file's lines with its fenced blocks blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        lines.append("" if fenced or FENCE.match(line) else line)
    return lines


def prose(path: Path) -> str:
    """The file's text without its fenced blocks and inline code (no link is read there)."""
    return "\n".join(CODE_SPAN.sub("``", line) for line in unfenced(path))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file, a repeated heading's with -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in unfenced(path):
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            name = slug(m.group(1))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return found


def broken_links(path: Path, top: Path = TOP) -> list[str]:
    text = prose(path)
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not this repository's
            continue
        file, _, anchor = target.partition("#")
        where = f"{path.relative_to(top)}:{text.count(chr(10), 0, m.start()) + 1}: ({target})"
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{where}: no {linked.relative_to(top) if linked.is_relative_to(top) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where}: no heading of {linked.relative_to(top)} has the anchor #{anchor}")
    return broken


def test_the_anchor_is_githubs():
    assert slug("Checkpoints and the controller: `--backup`") == "checkpoints-and-the-controller---backup"
    assert slug("On a GPU machine (one NVIDIA H100 80GB HBM3, 2026-11-22 and 23)") == \
        "on-a-gpu-machine-one-nvidia-h100-80gb-hbm3-2026-11-22-and-23"


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path):
    """The checker itself: a page with one good link, two broken, and one only in code."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "other.md").write_text("# Other page\n\n## Its part: `--x`\n")
    page = tmp_path / "sub" / "page.md"
    page.write_text("See [the part](other.md#its-part---x), [a\nfile](benchmarks/README.md),\n"
                    "[a part](other.md#no-such-part) and `[code](nowhere.md)`.\n\n```\n[fenced](gone.md)\n```\n")
    broken = broken_links(page, top=tmp_path)
    assert len(broken) == 2, broken
    assert broken[0].startswith("sub/page.md:1: (benchmarks/README.md): no sub/benchmarks/README.md")
    assert broken[1] == "sub/page.md:3: (other.md#no-such-part): no heading of sub/other.md has the anchor " \
                        "#no-such-part"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(TOP)))
def test_every_relative_link_leads_somewhere(doc):
    assert not broken_links(doc), "\n".join(broken_links(doc))


# ---- docs/layout.md: one line per module ----

ENTRY = re.compile(r"^( *)([\w.-]+(?:/|\.py|\.sh))(?=\s|$)")


def layout_paths() -> dict[str, int]:
    """Every path docs/layout.md's tree names (a line starting with a folder/ or a module), with its line:
    a line's folder is the nearest line above it that is indented less and names a folder."""
    text = (TOP / "docs" / "layout.md").read_text()
    tree = text.split("```")[1]
    named: dict[str, int] = {}
    parents: list[tuple[int, str]] = []
    for number, line in enumerate(tree.splitlines()):
        if not (m := ENTRY.match(line)):
            continue
        indent, name = len(m.group(1)), m.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + name
        named[path] = number
        if name.endswith("/"):
            parents.append((indent, path))
    return named


def modules() -> list[str]:
    return sorted(str(p.relative_to(TOP)) for top in ("train", "benchmarks", "lab") for p in (TOP / top).rglob("*.py")
                  if p.name != "__init__.py")


def test_layout_names_every_module_in_its_folder():
    named = layout_paths()
    assert "train/run/session.py" in named and "train/agent/data/corpus.py" in named  # the tree is read
    missing = [m for m in modules() if m not in named]
    assert not missing, f"docs/layout.md does not name {len(missing)} module(s): {', '.join(missing)}"


def test_layout_names_nothing_that_is_gone():
    gone = [path for path in layout_paths() if not (TOP / path).exists()]
    assert not gone, f"docs/layout.md names what the repository does not hold: {', '.join(gone)}"


# ---- docs/benchmarks.md's cost table: what `python -m train.plan.compare` prints now ----

BENCHMARKS = TOP / "docs" / "benchmarks.md"
LINK_CELL = {"100 Mb/s": "100", "1 Gb/s": "1000"}


def cost_table() -> tuple[str, list[list[str]]]:
    """The field report's command as the page quotes it, and its table's rows (cells, stripped)."""
    text = BENCHMARKS.read_text()
    command = re.search(r"`(python -m train\.plan\.compare --preset [^`]+)`", text).group(1)
    start = text.index("| link | run ")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return command, rows


def compare_output(command: str, mbit: str, capsys) -> tuple[dict[str, list[str]], list[str]]:
    """The command run (in this process: no hosts, a second), at `mbit`: its rows by label, its verdict."""
    from train.plan import compare

    argv = command.split()[3:]
    argv[argv.index("--link-mbit") + 1] = mbit
    capsys.readouterr()
    compare.main(argv)
    out = capsys.readouterr().out.splitlines()
    header = out[0]
    starts = [header.index(name) for name in ("s/update", "tokens/s", "efficiency", "hours", "dollars",
                                              "quality caveat")]
    rows = {}
    for line in out[1:]:
        if line.startswith(("fastest:", "cheapest:", "no dollars:")) or " faster than " in line:
            break
        cells = [line[:starts[0]].strip()] + [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None],
                                                                                 strict=True)]
        rows[cells[0]] = cells
    verdict = out[1 + len(rows):]
    return rows, verdict


def plain(cell: str) -> str:
    """A table cell without its emphasis and its note in parentheses: `**$306 (cheapest)**` -> `$306`."""
    return re.sub(r"\s*\([^)]*\)", "", cell.replace("**", "")).strip()


def test_the_cost_table_is_what_compare_prints(capsys):
    command, rows = cost_table()
    assert len(rows) >= 6 and "--link-mbit" in command
    shown: dict[str, set[str]] = {}
    for link, label, step, tokens, hours, dollars in rows:
        printed, verdict = compare_output(command, LINK_CELL[link], capsys)
        named = re.search(r"`([^`]+)`", label)  # the command's own label of the row
        assert named, f"{link}, {label}: the row does not name compare's row (its label in backticks)"
        name = named.group(1)
        shown.setdefault(link, set()).add(name)
        assert name in printed, f"{link}: compare prints no row {name!r}, only {sorted(printed)}"
        _, p_step, p_tokens, _, p_hours, p_dollars, _ = printed[name]
        assert [step, tokens, plain(hours), plain(dollars)] == [p_step, p_tokens, p_hours, p_dollars], \
            f"{link}, {name}: the page says {[step, tokens, hours, dollars]}, compare prints " \
            f"{[p_step, p_tokens, p_hours, p_dollars]}"
        for mark in ("fastest", "cheapest"):
            said = next(line for line in verdict if line.startswith(f"{mark}:"))
            assert (f"({mark})" in dollars) == said.startswith(f"{mark}: {name} ("), \
                f"{link}: the page marks {mark} otherwise than compare's verdict: {said}"
    for link, names in shown.items():
        printed, _ = compare_output(command, LINK_CELL[link], capsys)
        assert names == set(printed), f"{link}: the page leaves out {set(printed) - names}"


def test_the_cost_tables_verdict_is_what_compare_says(capsys):
    command, _ = cost_table()
    said = re.search(r'Verdict at both rates: "([^"]+)"', BENCHMARKS.read_text()).group(1)
    for mbit in LINK_CELL.values():
        _, verdict = compare_output(command, mbit, capsys)
        assert any(said in line for line in verdict), f"at {mbit} Mbit/s compare says {verdict}"


# ---- the prediction's accuracy: one measured figure, quoted the same everywhere ----

def test_the_predictions_accuracy_is_quoted_as_measured():
    measured = re.search(r"Every capped point is within ±(\d+)%", (TOP / "benchmarks" / "README.md").read_text())
    readme = re.search(r"predicted s/update is within ±(\d+)% of the measured one at every capped rate",
                       (TOP / "README.md").read_text())
    page = re.search(r"every capped rate predicted within ±(\d+)%", BENCHMARKS.read_text())
    assert measured and readme and page
    assert readme.group(1) == page.group(1) == measured.group(1)


# ---- fab -l: each task's first line ----

def test_fab_l_shows_each_task_in_a_whole_sentence():
    """`fab -l` prints a task's first docstring line (invoke.util.helpline): a sentence cut at the line's end
    reads as a fragment there."""
    from invoke.tasks import Task
    from invoke.util import helpline

    import fabfile

    tasks = {name: helpline(obj) for name, obj in vars(fabfile).items() if isinstance(obj, Task)}
    assert len(tasks) > 10
    cut = {name: line for name, line in tasks.items() if not (line or "").endswith(".")}
    assert not cut, f"fab -l shows these tasks mid-sentence: {cut}"
