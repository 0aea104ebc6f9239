"""A killed uploader's unfinished multipart uploads on S3 (billed, unseen by any listing) are aborted by the
next upload of the run, before it and after each copy (train.agent.offsite.upload.tidy); another run's are
left alone. moto's S3 server on loopback (test_offsite's fixture)."""

from __future__ import annotations

import subprocess
import sys

import boto3

from tests.unit.train.agent.offsite.test_offsite import files, s3, s3_server, upload_job  # noqa: F401
from train.agent.offsite import copies as offsite_copies


def open_upload(bucket: str, key: str) -> str:
    """A multipart upload begun, one part sent, never completed (as SIGKILL leaves one)."""
    client = boto3.client("s3")
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * (5 << 20))
    return upload


def still_open(bucket: str) -> set[str]:
    return {u["Key"] for u in boto3.client("s3").list_multipart_uploads(Bucket=bucket).get("Uploads", [])}


def test_the_next_upload_aborts_the_runs_unfinished_multipart_uploads_and_no_other_runs(s3, tmp_path):  # noqa: F811
    bucket = s3.split("/")[2]
    open_upload(bucket, "runs/r1/u10/checkpoint_last.pt")
    open_upload(bucket, "runs/r1/best/u5/checkpoint_best.pt")
    open_upload(bucket, "runs/r2/u7/checkpoint_last.pt")  # another run's: its own uploader's business
    assert len(still_open(bucket)) == 3
    upload_job(tmp_path / "run", s3, files(tmp_path / "src", 20), 20)
    done = subprocess.run([sys.executable, "-m", "train.agent.offsite.upload", "upload", "--run",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "aborted 2 unfinished multipart upload(s) under r1/" in done.stdout
    assert still_open(bucket) == {"runs/r2/u7/checkpoint_last.pt"}
    assert offsite_copies.newest(s3, "r1")["update"] == 20
