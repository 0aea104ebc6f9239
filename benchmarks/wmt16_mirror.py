"""A WMT16-shaped mirror: the archives `fab prepare-data --wmt16` downloads, with their real names
and member layout, holding a generated corpus of any size (the real one: 4.56M pairs), served over
HTTP with Range requests, so that the real download code (resume, checksum) runs against it.

    python -m benchmarks.wmt16_mirror build DIR --pairs 4560000 [--text SAMPLE_DIR]
    python -m benchmarks.wmt16_mirror serve DIR --bind 127.0.0.1 --port 8016

Then TANDEM_WMT16_MIRROR=http://ADDRESS:PORT makes prepare-data fetch from it. The text is a
sample's sentences (default: ../shared/data/wmt-en-de-sample) repeated to size, or the synthetic
corpus: the figures this gives are about size and time, not translation quality.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import re
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from train.agent.data import corpus, synthetic

# How WMT16 en-de's 4.56M training pairs divide between its corpora, and where each archive keeps them
TRAIN_SHARE = {"europarl": 1_920_209, "commoncrawl": 2_399_123, "news-commentary": 242_770}
LAYOUT = {
    "europarl": ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.{lang}"),
    "commoncrawl": ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{lang}"),
    "news-commentary": ("training-parallel-nc-v11.tgz", "training-parallel-nc-v11/news-commentary-v11.de-en.{lang}"),
}
DEV_ARCHIVE = "dev.tgz"
TEST_LINES = {"valid": 3000, "test": 3003}  # newstest2013, newstest2014 (en-de)
SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "wmt-en-de-sample"


def sentence_pairs(text: Path | None) -> Iterator[tuple[str, str]]:
    """Endless (en, de) pairs: a sample directory's train split over and over, else synthetic."""
    if text is not None and (text / "train.en").exists():
        en = (text / "train.en").read_text(encoding="utf-8").splitlines()
        de = (text / "train.de").read_text(encoding="utf-8").splitlines()
        return itertools.cycle(list(zip(en, de, strict=True)))
    return itertools.cycle(synthetic.generate_pairs(20000, seed=7))


def _add_text(tar: tarfile.TarFile, member: str, path: Path) -> None:
    tar.add(str(path), arcname=member)


def _sgml(lines: list[str], kind: str, lang: str) -> str:
    """A WMT SGML file (src or ref) with one document, entities escaped as the real ones are."""
    tag = "srcset" if kind == "src" else "refset"
    segs = "".join(f'<seg id="{i}">{line.replace("&", "&amp;").replace("<", "&lt;")}</seg>\n'
                   for i, line in enumerate(lines, start=1))
    return (f'<{tag} setid="newstest" srclang="en" trglang="de">\n<doc sysid="{kind}" docid="1" '
            f'genre="news" origlang="{lang}">\n{segs}</doc>\n</{tag}>\n')


def build(out: Path, pairs: int, text: Path | None = SAMPLE) -> dict[str, int]:
    """Write the four archives into `out`; returns {archive: bytes}."""
    out.mkdir(parents=True, exist_ok=True)
    source = sentence_pairs(text)
    total = sum(TRAIN_SHARE.values())
    shares = {name: pairs * n // total for name, n in TRAIN_SHARE.items()}
    shares["europarl"] += pairs - sum(shares.values())
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        for name, (archive, member) in LAYOUT.items():
            files = {lang: Path(tmp) / f"{name}.{lang}" for lang in corpus.LANGS}
            with open(files["en"], "w", encoding="utf-8") as fen, open(files["de"], "w", encoding="utf-8") as fde:
                for en, de in itertools.islice(source, shares[name]):
                    fen.write(en + "\n")
                    fde.write(de + "\n")
            with tarfile.open(out / f".{archive}.partial", "w:gz", compresslevel=1) as tar:
                for lang, path in files.items():
                    _add_text(tar, member.format(lang=lang), path)
                    path.unlink()
            (out / f".{archive}.partial").rename(out / archive)
        held_out = synthetic.generate_pairs(sum(TEST_LINES.values()), seed=11)
        with tarfile.open(out / f".{DEV_ARCHIVE}.partial", "w:gz") as tar:
            start = 0
            for split, n in TEST_LINES.items():
                chunk = held_out[start:start + n]
                start += n
                for lang, column in (("en", 0), ("de", 1)):
                    kind = "src" if lang == "en" else "ref"
                    member = corpus.WMT16_DEV[split][lang]
                    path = Path(tmp) / member
                    path.write_text(_sgml([p[column] for p in chunk], kind, lang), encoding="utf-8")
                    _add_text(tar, f"dev/{member}", path)
        (out / f".{DEV_ARCHIVE}.partial").rename(out / DEV_ARCHIVE)
    return {p.name: p.stat().st_size for p in sorted(out.glob("*.tgz"))}


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files with `Range: bytes=N-` answered 206 from N, as the corpus servers do; streamed."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file() or path.name.startswith("."):
            self.send_error(404)
            return
        size = path.stat().st_size
        match = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(match.group(1)) if match else 0
        if start >= size and match:
            self.send_error(416)
            return
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            while block := f.read(1 << 20):
                self.wfile.write(block)


def serve(root: Path, bind: str = "127.0.0.1", port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Start serving `root` in a thread; returns the server (shutdown() it) and its base URL."""
    handler = lambda *a, **k: RangeHandler(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer((bind, port), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{bind}:{httpd.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir", type=Path)
    b.add_argument("--pairs", type=int, default=sum(TRAIN_SHARE.values()))
    b.add_argument("--text", type=Path, default=SAMPLE)
    s = sub.add_parser("serve")
    s.add_argument("dir", type=Path)
    s.add_argument("--bind", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8016)
    args = parser.parse_args()
    if args.command == "build":
        for name, size in build(args.dir, args.pairs, args.text).items():
            print(f"{name}: {size / 1e6:.1f} MB")
    else:
        httpd, url = serve(args.dir, args.bind, args.port)
        print(f"serving {args.dir} at {url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
