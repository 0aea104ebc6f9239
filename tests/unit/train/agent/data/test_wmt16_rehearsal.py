"""prepare-data --wmt16 against a WMT16-shaped mirror on loopback (real archive names and layout,
a small generated corpus): the standard splits, Ctrl-C and resume, a re-run that does nothing."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from rich.console import Console

from benchmarks import wmt16_mirror
from tests.labtools import as_at_a_terminal
from train.agent.data import corpus, progress, sgml
from train.data import progress as bars


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    www = tmp_path_factory.mktemp("www")
    wmt16_mirror.build(www, pairs=1000)
    httpd, url = wmt16_mirror.serve(www)
    yield www, url
    httpd.shutdown()
    httpd.server_close()


def runner(work: Path, url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "train.agent.data", str(work), "wmt16", "--wmt16",
                             "--vocab-size", "400"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TANDEM_WMT16_MIRROR": url}, preexec_fn=as_at_a_terminal)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return json.loads(next(line for line in out.splitlines() if line.startswith("@@tandem-result "))[16:])


def markers(root: Path) -> dict[str, int]:
    return {m.name: m.stat().st_mtime_ns for m in root.glob(".*.done")}


def test_ctrl_c_in_binarize_resumes_there_and_a_rerun_does_nothing(mirror, tmp_path):
    www, url = mirror
    work = tmp_path / "cache"
    proc = runner(work, url)
    assert proc.stdout is not None
    for line in proc.stdout:  # the user presses Ctrl-C once the binaries are being written
        event = progress.parse(line)
        if event and event["stage"] == "binarize":
            proc.send_signal(signal.SIGINT)
            break
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    root = work / "wmt16"
    assert set(markers(root)) == {".raw.done", ".text.done", ".spm.done", ".subwords.done"}
    assert not (root / "bin").exists()  # nothing half made under the name training reads
    before = markers(root)

    result = finish(runner(work, url))
    after = markers(root)
    assert {k: after[k] for k in before} == before  # the finished stages were not made again
    assert ".bin.done" in after
    assert 950 <= result["corpus"]["train_lines"] <= 1000  # a few dropped by the length filters
    manifest = (root / "bin" / "MANIFEST.sha256").read_text()

    finish(runner(work, url))  # nothing changed: nothing is done
    assert markers(root) == after
    assert (root / "bin" / "MANIFEST.sha256").read_text() == manifest

    # the standard splits: valid newstest2013, test newstest2014, the reference as the SGML has it
    with tarfile.open(www / "dev.tgz") as tar:
        ref = tar.extractfile("dev/newstest2014-deen-ref.de.sgm").read().decode()
    (tmp_path / "ref.sgm").write_text(ref)
    assert (root / "bin" / "test.ref.de").read_text().splitlines() == sgml.segments(tmp_path / "ref.sgm")
    assert len((root / "text" / "valid.de").read_text().splitlines()) == 3000
    assert len((root / "text" / "test.de").read_text().splitlines()) == 3003


def test_a_changed_vocabulary_redoes_the_subwords_and_after_only(mirror, tmp_path, monkeypatch):
    www, url = mirror
    monkeypatch.setenv("TANDEM_WMT16_MIRROR", url)
    work = tmp_path / "cache"
    corpus.prepare("wmt16", work, wmt16=True, vocab_size=300)
    before = markers(work / "wmt16")
    prepared = corpus.prepare("wmt16", work, wmt16=True, vocab_size=350)
    after = markers(work / "wmt16")
    assert {k for k in before if after[k] != before[k]} == {".spm.done", ".subwords.done", ".bin.done"}
    assert prepared.vocab_asked == 350


def test_a_full_disk_is_refused_naming_host_need_and_free(tmp_path):
    with pytest.raises(corpus.DataError) as err:
        corpus.check_disk(tmp_path, need=10**18, host="rank0-host")
    assert str(err.value).startswith("rank0-host: not enough disk to prepare in ")
    assert "needs 1000000000.00 GB" in str(err.value) and "GB free" in str(err.value)


def test_progress_lines_are_drawn_per_stage_with_counts(tmp_path):
    lines = io.StringIO()
    report = progress.Lines(lines, every_s=0)
    report.start("clean", total=4_560_000, unit="pairs")
    report.advance(1_000_000)
    report.finish()
    screen = io.StringIO()
    other = bars.render(["fairseq says hello\n", *lines.getvalue().splitlines(keepends=True)],
                            Console(file=screen, width=120, force_terminal=False))
    assert other == ["fairseq says hello"]
    assert "clean" in screen.getvalue() and "1000000/1000000" in screen.getvalue()


def test_sgml_segments_are_read_as_sacrebleu_reads_them(tmp_path):
    path = tmp_path / "t.sgm"
    path.write_text('<refset>\n<doc docid="1">\n<seg id="1"> Ein  Haus &amp; ein Hof </seg>\n'
                    '<seg id="2">zwei</seg>\n</doc>\n</refset>\n')
    assert sgml.segments(path) == ["Ein Haus &amp; ein Hof", "zwei"]
    (tmp_path / "plain.txt").write_text("no tags\n")
    with pytest.raises(sgml.SgmlError, match="plain.txt: no <seg> lines"):
        sgml.segments(tmp_path / "plain.txt")


def test_the_disk_is_checked_before_the_first_byte_is_downloaded(mirror, tmp_path, monkeypatch):
    """The servers' sizes (HEAD) say what the archives and what is made of them will take: a disk
    without the room is refused before anything is fetched, naming the host."""
    www, url = mirror
    monkeypatch.setenv("TANDEM_WMT16_MIRROR", url)
    archives = sum(p.stat().st_size for p in www.iterdir() if p.is_file())
    need = corpus.download_need(tmp_path, corpus.current_sources())
    assert need == corpus.disk_needed(archives * 3, archives)
    monkeypatch.setattr(corpus, "disk_needed", lambda raw, archived=0: 10**18)  # a disk far too small
    with pytest.raises(corpus.DataError) as err:
        corpus.download_wmt16(tmp_path / "downloads", host="rank0-host")
    assert str(err.value).startswith("rank0-host: not enough disk to prepare in ")
    assert not list((tmp_path / "downloads").glob("*.tgz*"))  # nothing fetched
