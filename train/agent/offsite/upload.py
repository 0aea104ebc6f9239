"""Checkpoint copies off the cluster, on a host (`fab train --checkpoints-to URL`).

    python -m train.agent.offsite.upload check URL [--host NAME]   (fab train, on every host: a probe copy made,
                                                                    listed, fetched back, deleted; its speed)
    python -m train.agent.offsite.upload runs URL                   (each run's newest whole copy, or URL's own copy)
    python -m train.agent.offsite.upload fetch URL RUN DEST [--update N]  (RUN's newest copy whose every sha256
                                                                    matches, into DEST; the refused ones said)
    python -m train.agent.offsite.upload upload --run DIR           (the keeper's child: RUN/keeper/offsite-job.json)

Where and how: train.agent.offsite.target (the URL), train.agent.offsite.copies (the store's layout,
whole copies, fetch), train.agent.offsite.schedule (when rank 0's host's keeper uploads). Each command
prints one JSON line; a failure prints {"error": "..."} and exits 1 (a malformed URL: 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from train.agent.offsite import copies
from train.agent.offsite.target import BadTarget, redacted

JOB, RESULT = "offsite-job.json", "offsite-result.json"  # in RUN/keeper/: what to upload, what was


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def lower_priority() -> None:
    """The upload yields to training: CPU niceness 10, the lowest best-effort disk priority."""
    import psutil

    me = psutil.Process()
    try:
        me.nice(10)
        if hasattr(psutil, "IOPRIO_CLASS_BE"):
            me.ionice(psutil.IOPRIO_CLASS_BE, 7)
    except (psutil.Error, OSError):
        pass


def upload_job(run_dir: str) -> dict:
    """Every copy the keeper's job file names, uploaded in order; the result (the manifests uploaded, or
    the error) written beside it for the keeper, whole or not at all."""
    kdir = Path(run_dir) / "keeper"
    job = json.loads((kdir / JOB).read_text())
    target = copies.parse(job["url"])
    done, error = [], ""
    try:
        fs = target.filesystem()
        tidy(fs, target, job["run_id"])
        for item in job["items"]:
            made = copies.upload(target, job["run_id"], item["kind"], item["update"],
                                 {name: Path(path) for name, path in item["files"].items()},
                                 item.get("expected"), {**job.get("facts", {}), **item.get("facts", {})}, fs=fs)
            done.append({k: made[k] for k in ("kind", "update", "time", "where")})
            print(f"{item['kind']} of update {item['update']}: {made['where']}", flush=True)
            tidy(fs, target, job["run_id"])
    except Exception as err:  # the keeper redoes the job later and says why
        error = copies.said(err)
        print(f"upload failed: {error}", flush=True)
    result = {"id": job["id"], "done": done, "error": error}
    _write_json(kdir / RESULT, result)
    return result


def tidy(fs, target, run_id: str) -> None:
    """A killed upload's parts left on S3, aborted; a store that will not list them is said, not fatal
    (the bucket's lifecycle rule, AbortIncompleteMultipartUpload, is the backstop)."""
    try:
        if aborted := copies.abort_stale_uploads(fs, target, run_id):
            print(f"aborted {aborted} unfinished multipart upload(s) under {run_id}/ (an uploader killed)", flush=True)
    except Exception as err:  # s3:ListBucketMultipartUploads or s3:AbortMultipartUpload not granted
        print(f"unfinished multipart uploads under {run_id}/ not aborted: {copies.said(err)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.agent.offsite.upload", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("check", help="a probe copy made, listed, fetched back and deleted under URL; its write speed")
    c.add_argument("url")
    c.add_argument("--host", default="", help="this host's name in the run (said in the fix)")
    n = sub.add_parser("runs", help="each run's newest whole copy under URL (URL a copy's folder: that copy)")
    n.add_argument("url")
    f = sub.add_parser("fetch", help="RUN's newest copy under URL whose every sha256 matches, into DEST")
    f.add_argument("url")
    f.add_argument("run")
    f.add_argument("dest")
    f.add_argument("--update", type=int, help="that update's copy only")
    u = sub.add_parser("upload", help="the keeper's job (RUN/keeper/offsite-job.json)")
    u.add_argument("--run", required=True)
    args = p.parse_args(argv)
    try:
        if args.what == "check":
            print(json.dumps({"ok": True, "url": redacted(args.url), **copies.check(args.url, args.host)}))
        elif args.what == "runs":
            print(json.dumps(copies.listed(args.url)))
        elif args.what == "fetch":
            print(json.dumps(copies.fetch_whole(args.url, args.run, args.dest, args.update)))
        else:
            lower_priority()
            return 1 if upload_job(args.run)["error"] else 0
    except BadTarget as err:
        print(json.dumps({"error": str(err)}))
        return 2
    except Exception as err:  # every store raises its own (botocore's, google's, paramiko's): said in one line
        print(json.dumps({"error": str(err) if isinstance(err, copies.OffsiteError) else copies.said(err)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
