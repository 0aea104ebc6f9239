"""prepare-data's parts: the download (against a real HTTP server on loopback) and the pipeline."""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import tarfile
import threading
from pathlib import Path

import pytest

from train.agent.data import corpus, download


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with HTTP Range support, like the corpus mirrors do."""

    requests: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        body = path.read_bytes()
        match = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
        RangeHandler.requests.append(self.headers.get("Range", "full"))
        start = int(match.group(1)) if match else 0
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self.wfile.write(body[start:])


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: RangeHandler(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    RangeHandler.requests = []
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def make_tarball(path: Path, files: dict[str, str]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            blob = text.encode()
            info = tarfile.TarInfo(f"corpus/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_resumes_a_partial_file_and_checks_the_sum(server, tmp_path):
    root, url = server
    digest = make_tarball(root / "nc.tgz", {"nc.en": "a house\n" * 5000, "nc.de": "ein Haus\n" * 5000})
    dest = tmp_path / "dl" / "nc.tgz"
    dest.parent.mkdir()
    whole = (root / "nc.tgz").read_bytes()
    dest.with_name("nc.tgz.part").write_bytes(whole[:100])  # an interrupted download
    download.fetch(f"{url}/nc.tgz", dest, digest)
    assert dest.read_bytes() == whole
    assert RangeHandler.requests == ["bytes=100-"]
    files = download.extract(dest, ("nc.en", "nc.de"), tmp_path / "x")
    assert sorted(p.name for p in files) == ["nc.de", "nc.en"]


def test_a_corrupt_download_is_refused_and_not_kept(server, tmp_path):
    root, url = server
    make_tarball(root / "nc.tgz", {"nc.en": "x\n"})
    dest = tmp_path / "nc.tgz"
    with pytest.raises(download.DownloadError, match="checksum mismatch"):
        download.fetch(f"{url}/nc.tgz", dest, "0" * 64)
    assert not dest.exists() and not dest.with_name("nc.tgz.part").exists()


def test_a_missing_file_names_the_url_and_status(server, tmp_path):
    _, url = server
    with pytest.raises(download.DownloadError, match=r"nope.tgz: HTTP 404"):
        download.fetch(f"{url}/nope.tgz", tmp_path / "nope.tgz")


def test_cleaning_normalizes_and_drops_broken_pairs(tmp_path):
    (tmp_path / "a.en").write_text("a  house\u00a0here\n\nfine words\n" + "x " * 300 + "\n")
    (tmp_path / "a.de").write_text("ein Haus hier\nleer\nschöne Wörter\nkurz\n")
    out = tmp_path / "out"
    out.mkdir()
    kept = corpus.clean_split({"en": tmp_path / "a.en", "de": tmp_path / "a.de"}, out, "train", filter_pairs=True)
    assert kept == 2
    assert (out / "train.en").read_text() == "a house here\nfine words\n"


def test_a_source_directory_without_the_files_is_named(tmp_path):
    with pytest.raises(corpus.DataError, match="train.en"):
        corpus.raw_from_directory(tmp_path)


def test_the_pipeline_turns_real_text_into_fairseq_binaries_with_a_manifest(tmp_path):
    sample = Path(__file__).resolve().parents[6] / "shared" / "data" / "wmt-en-de-sample"
    if not sample.exists():
        pytest.skip("shared/data/wmt-en-de-sample is not beside the checkout")
    prepared = corpus.prepare("sample", tmp_path, source=sample, vocab_size=800)
    assert prepared.train_lines > 9000 and prepared.train_mb > 2
    bin_dir = Path(prepared.bin_dir)
    listed = {line.split()[1] for line in (bin_dir / "MANIFEST.sha256").read_text().splitlines()}
    assert listed == {p.name for p in bin_dir.iterdir()} - {"MANIFEST.sha256"}
    assert {"train.en-de.en.bin", "dict.en.txt", "spm.model", "test.ref.de"} <= listed
    assert prepared.vocab_size > 700


def test_wmt16_archives_are_fetched_once_and_kept(server, tmp_path, monkeypatch):
    """The download step `fab prepare-data --wmt16` runs before its spinner, against a loopback mirror."""
    root, url = server
    sources = {}
    for name in ("europarl", "news-commentary"):
        digest = make_tarball(root / f"{name}.tgz", {f"{name}.en": "a house\n", f"{name}.de": "ein Haus\n"})
        sources[name] = download.Source(f"{url}/{name}.tgz", digest, (f"{name}.en", f"{name}.de"))
    monkeypatch.setattr(corpus, "WMT16_SOURCES", sources)
    archives = corpus.download_wmt16(tmp_path / "downloads")
    assert {n: p.name for n, p in archives.items()} == {"europarl": "europarl.tgz",
                                                        "news-commentary": "news-commentary.tgz"}
    assert RangeHandler.requests == ["full", "full"]
    corpus.download_wmt16(tmp_path / "downloads")  # a second prepare-data: nothing fetched again
    assert RangeHandler.requests == ["full", "full"]


def write_pair(src: Path, en: bytes, de: bytes, splits=("train", "valid")) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    for split in splits:
        (src / f"{split}.en").write_bytes(en)
        (src / f"{split}.de").write_bytes(de)
    return src


GOOD_EN, GOOD_DE = b"a small house\nthe red car\n" * 50, b"ein kleines Haus\ndas rote Auto\n" * 50


@pytest.mark.parametrize("en, de, says", [
    (GOOD_EN + b"one more\n", GOOD_DE, "train.en: 101 lines but {src}/train.de has 100: the two sides of train "
                                       "must be line-aligned"),
    (b"", GOOD_DE, "train.en: empty: the train split needs one sentence per line"),
    (GOOD_EN, GOOD_DE[:31] + b"Gr\xfc\xdfe\n" + GOOD_DE[31:], "train.de:3: not UTF-8 (byte 0xfc at column 3)"),
])
def test_a_broken_corpus_stops_with_one_line_naming_the_file_and_nothing_is_left(tmp_path, en, de, says):
    src = write_pair(tmp_path / "src", en, de)
    work = tmp_path / "cache"
    with pytest.raises(corpus.DataError) as err:
        corpus.prepare("broken", work, source=src, vocab_size=100)
    message = str(err.value)
    assert "\n" not in message and says.format(src=src) in message
    assert message.startswith(str(src))
    assert not work.exists() or list(work.iterdir()) == []


def test_a_failed_preparation_keeps_the_previous_good_one(tmp_path):
    work = tmp_path / "cache"
    good = corpus.prepare("mine", work, source=write_pair(tmp_path / "good", GOOD_EN, GOOD_DE), vocab_size=60)
    manifest = (Path(good.bin_dir) / "MANIFEST.sha256").read_text()
    with pytest.raises(corpus.DataError):
        corpus.prepare("mine", work, source=write_pair(tmp_path / "bad", GOOD_EN, b""))
    assert (Path(good.bin_dir) / "MANIFEST.sha256").read_text() == manifest
    assert sorted(p.name for p in work.iterdir()) == ["mine"]


def test_a_vocabulary_smaller_than_asked_is_said_with_why(tmp_path):
    prepared = corpus.prepare("tiny", tmp_path / "cache", source=write_pair(tmp_path / "src", GOOD_EN, GOOD_DE),
                              vocab_size=32000)
    assert prepared.vocab_asked == 32000 and prepared.vocab_size < 100
    assert prepared.vocab_note.startswith("vocabulary ") and "of the 32000 asked: 100 training pairs" in \
        prepared.vocab_note and "--vocab-size" in prepared.vocab_note
