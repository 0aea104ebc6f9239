"""No secret a URL holds is ever said back (train.agent.offsite.target.redacted, the one redaction for every
URL): passwords (a '/' in one included), presigned query strings, session tokens, through the parser, the
hosts' offsite commands, fab train's --resume-from and --checkpoints-to, and a store's own error text."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from train.agent.offsite import copies
from train.agent.offsite.target import BadTarget, parse, redacted
from train.cluster import Host
from train.errors import OptionError
from train.run import moved, offsite

TOP = Path(__file__).parents[5]
FAB = Path(sys.executable).parent / "fab"

# (URL, what must never be said back)
SECRET_URLS = [
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@ckpts/runs",
     ["wJalrXUtnFEMI", "K7MDENG", "bPxRfiCYEXAMPLEKEY"]),
    ("sftp://backup:hunter2hunter2@store.example/srv/ckpts", ["hunter2hunter2"]),
    ("sftp://backup:s3cr3t/p4ss/w0rd@store.example:2222/srv/ckpts", ["s3cr3t", "p4ss", "w0rd"]),
    ("s3://ckpts/runs?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F20261129&X-Amz-Signature=f00dfeedbeef42",
     ["f00dfeedbeef42", "20261129"]),
    ("https://ckpts.s3.amazonaws.com/runs?X-Amz-Security-Token=FQoGZXIvYXdzEPT//////////wEaDOlong&x=1",
     ["FQoGZXIvYXdzEPT", "wEaDOlong"]),
    ("gs://ckpts/runs#access_token=ya29.a0AfH6SMBx", ["ya29.a0AfH6SMBx"]),
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMIK7MDENG", ["wJalrXUtnFEMIK7MDENG"]),
]


def never_said(text: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in text, f"{secret!r} said back in: {text}"


@pytest.mark.parametrize(("url", "secrets"), SECRET_URLS)
def test_the_parser_and_the_redaction_never_repeat_a_secret(url, secrets):
    never_said(redacted(url), secrets)
    with pytest.raises(BadTarget) as refused:
        parse(url)
    never_said(str(refused.value), secrets)
    never_said(copies.said(ConnectionError(f"could not reach {url}: refused")), secrets)  # a store's own text
    assert redacted("sftp://backup@store.example:2222/srv") == "sftp://backup@store.example:2222/srv"


@pytest.mark.parametrize(("url", "secrets"), SECRET_URLS)
def test_resume_from_is_refused_on_the_controller_without_repeating_the_secret(url, secrets):
    with pytest.raises(OptionError) as refused:
        offsite.store_url(url)
    assert refused.value.option == "--resume-from"
    never_said(str(refused.value), secrets)
    host = Host(name="new0", address="127.0.0.1", vars={"gpus": 1, "train_env_venv": sys.prefix})
    out = io.StringIO()
    with pytest.raises(OptionError) as refused:  # before any host is asked
        moved.adopt(url, None, [host], Console(file=out))
    never_said(str(refused.value) + out.getvalue(), secrets)


@pytest.mark.parametrize(("url", "secrets"), SECRET_URLS[:4])
def test_the_hosts_offsite_commands_never_print_a_secret(url, secrets, tmp_path):
    for args in (["check", url, "--host", "v100a"], ["runs", url], ["fetch", url, "r1", str(tmp_path / "d")]):
        done = subprocess.run([sys.executable, "-m", "train.agent.offsite.upload", *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        never_said(done.stdout + done.stderr, secrets)


@pytest.mark.parametrize(("option", "url", "secrets"), [("--resume-from", *SECRET_URLS[0]),
                                                       ("--resume-from", *SECRET_URLS[3]),
                                                       ("--checkpoints-to", *SECRET_URLS[2])])
def test_fab_train_refuses_a_url_holding_a_secret_with_exit_2_and_never_says_it(option, url, secrets):
    done = subprocess.run([str(FAB), "train", option, url], cwd=TOP, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2 and f"{option}:" in done.stderr + done.stdout
    never_said(done.stdout + done.stderr, secrets)
