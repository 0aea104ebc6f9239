"""The lab's object store: an S3-compatible server (moto's, the server s3fs's own test suite runs
against) on a host of its own, a network namespace on the lab's bridge. It outlives the lab's hosts
(`lab down` takes them, disks included) and plugs into the next lab's bridge, as a cloud bucket
outlives the VMs that wrote to it. The hosts reach it over the lab's network, with the credentials
and endpoint a provider's config gives them (~/.aws on each host), never through the controller."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from lab.config import LabConfig

PORT = 9000
KEY = "tandem-lab-key"  # moto takes any credentials: these only show where they live (~/.aws on the hosts)


class StorageHost:
    def __init__(self, name: str = "tdmstore"):
        self.ns, self.link, self.address = name, f"{name}0", ""
        self.server: subprocess.Popen | None = None

    def start(self, cfg: LabConfig) -> None:
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"], check=True)
        self.plug(cfg)
        moto = Path(sys.executable).with_name("moto_server")
        self.server = subprocess.Popen(["ip", "netns", "exec", self.ns, str(moto), "-H", "0.0.0.0", "-p", str(PORT)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.answers():
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise AssertionError(f"moto's S3 server did not answer at {self.endpoint}")
            time.sleep(0.5)

    def plug(self, cfg: LabConfig) -> None:
        """Onto `cfg`'s bridge at the subnet's .250 (a lab brought up again: another bridge, another address)."""
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "link", "del", "eth0"], capture_output=True)
        self.address = str(cfg.network[250])
        subprocess.run(["ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.ns],
                       check=True)
        subprocess.run(["ip", "link", "set", self.link, "master", cfg.bridge, "up"], check=True)
        inside = ["ip", "netns", "exec", self.ns]
        subprocess.run([*inside, "ip", "addr", "add", f"{self.address}/{cfg.network.prefixlen}", "dev", "eth0"],
                       check=True)
        subprocess.run([*inside, "ip", "link", "set", "eth0", "up"], check=True)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{PORT}"

    def answers(self) -> bool:
        probe = ["ip", "netns", "exec", self.ns, sys.executable, "-c",
                 f"import urllib.request; urllib.request.urlopen({self.local!r}, timeout=2)"]
        return subprocess.run(probe, capture_output=True).returncode == 0

    @property
    def local(self) -> str:
        return f"http://127.0.0.1:{PORT}/"

    def run(self, code: str) -> subprocess.CompletedProcess:
        """Python inside the store's namespace (the controller reaches the bucket only there)."""
        return subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=120)

    def _s3(self, then: str) -> subprocess.CompletedProcess:
        done = self.run("import s3fs; fs = s3fs.S3FileSystem(key='k', secret='s', client_kwargs={'endpoint_url': "
                        f"{self.local!r}, 'region_name': 'us-east-1'}}); {then}")
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    def make_bucket(self, bucket: str) -> None:
        made = self.run("import boto3; boto3.client('s3', endpoint_url=" + repr(self.local) + ", region_name="
                        "'us-east-1', aws_access_key_id='k', aws_secret_access_key='s').create_bucket(Bucket="
                        + repr(bucket) + ")")
        assert made.returncode == 0, made.stderr[-2000:]

    def objects(self, bucket: str) -> list[str]:
        """Every key in `bucket`, listed with s3fs as the hosts see them."""
        return self._s3(f"print('\\n'.join(fs.find({bucket!r})))").stdout.split()

    def read(self, key: str) -> bytes:
        return self._s3(f"import sys; sys.stdout.buffer.write(fs.cat({key!r}))").stdout.encode()

    def aws_config(self) -> str:
        """The shell line that gives a host's login user this store as its S3 (what `aws configure`
        writes, with the endpoint an S3-compatible store needs)."""
        config = f"[default]\nregion = us-east-1\nendpoint_url = {self.endpoint}\n"
        credentials = f"[default]\naws_access_key_id = {KEY}\naws_secret_access_key = {KEY}\n"
        return (f"mkdir -p ~/.aws && printf %s {shlex.quote(config)} > ~/.aws/config && "
                f"printf %s {shlex.quote(credentials)} > ~/.aws/credentials && chmod 600 ~/.aws/credentials")

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()  # ip netns exec execs moto: this pid is the server's
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
