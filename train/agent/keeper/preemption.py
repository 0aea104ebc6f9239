"""A cloud's notice that it reclaims this host (a spot VM), heard before the host is gone.

The keeper (train.agent.keeper.loop) runs a `Watcher` on a cloud VM: which cloud this is comes from the
VM's DMI tables (/sys/class/dmi/id), and only that cloud's documented metadata endpoint is asked,
every POLL_S (AWS asks for 5 s), with a TIMEOUT_S answer time. Off a cloud (the lab, a laptop, a
bare-metal host) nothing polls: no request to 169.254.169.254 ever leaves a host that is not a VM
of that cloud. A failing endpoint is said once in the keeper's log, never raised.

- AWS (sys_vendor `Amazon EC2`; a Xen instance: `amazon` in bios_version): IMDSv2, a session token
  (`PUT /latest/api/token`, header `X-aws-ec2-metadata-token-ttl-seconds`), then
  `GET /latest/meta-data/spot/instance-action` with `X-aws-ec2-metadata-token`: 404 while none,
  200 `{"action": "terminate" | "stop" | "hibernate", "time": "2026-05-01T14:02:11Z"}` two minutes
  before (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
- GCP (product_name `Google Compute Engine`): `GET /computeMetadata/v1/instance/preempted` with
  `Metadata-Flavor: Google` answers `FALSE`, then `TRUE` once the VM is preempted (30 s before it
  stops); `instance/maintenance-event` answers `NONE`, `MIGRATE_ON_HOST_MAINTENANCE` (live
  migration: the host stays) or `TERMINATE_ON_HOST_MAINTENANCE` (a notice too). Neither says when:
  the deadline is taken as NOTICE_S after it was seen
  (cloud.google.com/compute/docs/instances/create-use-spot, "Detect preemption";
  cloud.google.com/compute/docs/metadata/getting-live-migration-notice).
- Azure (chassis_asset_tag `7783-7084-3265-9085-8269-3286-77`): Scheduled Events,
  `GET /metadata/scheduledevents?api-version=2020-07-01` with `Metadata: true`:
  `{"DocumentIncarnation": n, "Events": [{"EventId", "EventType", "ResourceType": "VirtualMachine",
  "Resources": ["vmname"], "EventStatus": "Scheduled" | "Started", "NotBefore": "Mon, 19 Sep 2016
  18:29:47 GMT", ...}]}`. Events go to every VM of an availability set or scale set: only one whose
  Resources name this VM (`GET /metadata/instance/compute/name?api-version=2021-02-01&format=text`)
  counts, and only the types that take the VM away for minutes or for good: Preempt (a spot VM
  evicted, >= 30 s), Terminate, Reboot, Redeploy (Freeze, seconds long, does not)
  (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).

Tests only: TANDEM_TEST_DMI names a directory standing in for /sys/class/dmi/id, and
TANDEM_TEST_METADATA_URL a base URL standing in for the cloud's metadata server (a loopback server
answering as the cloud's does). Nothing else reads them; a real host never has them set.

On a notice the keeper holding rank 0 asks its fairseq process to save checkpoint_last now
(`save_now`: SAVE_NOW_SIGNAL to the pid rank 0 wrote in RANK0_PID, train.agent.trainer.fairseq_train), and
the leader goes on without the leaving host from that save (train.agent.keeper.generation.decide).
"""

from __future__ import annotations

import calendar
import contextlib
import email.utils
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

POLL_S = 5.0  # how often the endpoint is asked (AWS: "we recommend that you check ... every 5 seconds")
TIMEOUT_S = 2.0  # an answer's wait: the metadata server is on the host's own link
NOTICE_S = 30.0  # a notice that does not say when (GCP's: 30 s before the VM stops) gives this long
AZURE_LEAVES = ("Preempt", "Terminate", "Reboot", "Redeploy")  # Scheduled Events that take the VM away
DMI = "/sys/class/dmi/id"
SAVE_NOW_SIGNAL = signal.SIGUSR2  # rank 0's fairseq process saves checkpoint_last at its update's end
RANK0_PID = ".rank0.pid"  # in the save directory, written by rank 0's fairseq process


@dataclass(frozen=True)
class Notice:
    """A cloud's word that this VM goes: `cloud`'s `what` (its `action`) at `deadline` (wall clock)."""

    cloud: str
    what: str
    action: str
    deadline: float

    def words(self) -> str:
        """`AWS spot notice (terminate at 14:02:11Z)`."""
        return f"{self.cloud} {self.what} ({self.action} at {time.strftime('%H:%M:%SZ', time.gmtime(self.deadline))})"


class MetadataError(RuntimeError):
    """The metadata server did not answer as documented."""


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy: it is link-local


def _ask(method: str, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _DIRECT.open(request, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read(1 << 20)
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (OSError, ValueError) as err:
        raise MetadataError(f"{url}: {type(err).__name__}: {err}") from err


def _read(dmi: Path, name: str) -> str:
    try:
        return (dmi / name).read_text(errors="replace").strip()
    except OSError:
        return ""


class Cloud:
    """One cloud: how its VMs are told apart (DMI), its metadata server, how it says a VM goes."""

    name = ""
    base_url = ""

    @staticmethod
    def here(dmi: Path) -> bool:
        raise NotImplementedError

    def __init__(self, base_url: str | None = None):
        self.base = (base_url or self.base_url).rstrip("/")

    def notice(self, host: str, now: float) -> Notice | None:
        """The cloud's notice for this VM now, or None; MetadataError when its server does not answer."""
        raise NotImplementedError


class Aws(Cloud):
    name, base_url = "AWS", "http://169.254.169.254"
    token_ttl_s = 21600

    def __init__(self, base_url: str | None = None):
        super().__init__(base_url)
        self.token, self.token_until = "", 0.0

    @staticmethod
    def here(dmi: Path) -> bool:
        return _read(dmi, "sys_vendor") == "Amazon EC2" or "amazon" in _read(dmi, "bios_version").lower()

    def notice(self, host: str, now: float) -> Notice | None:
        if not self.token or time.monotonic() > self.token_until:
            status, body = _ask("PUT", f"{self.base}/latest/api/token",
                                {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)})
            if status != 200 or not body:
                raise MetadataError(f"{self.base}/latest/api/token: HTTP {status} (IMDSv2's session token)")
            self.token, self.token_until = body.decode().strip(), time.monotonic() + self.token_ttl_s - 60
        status, body = _ask("GET", f"{self.base}/latest/meta-data/spot/instance-action",
                            {"X-aws-ec2-metadata-token": self.token})
        if status == 404:
            return None
        if status == 401:  # the token expired early (a clock step): a new one at the next poll
            self.token = ""
            raise MetadataError("IMDSv2 refused the session token (401): a new one at the next poll")
        if status != 200:
            raise MetadataError(f"spot/instance-action: HTTP {status}")
        try:
            said = json.loads(body)
            deadline = float(calendar.timegm(time.strptime(said["time"], "%Y-%m-%dT%H:%M:%SZ")))
        except (ValueError, KeyError, TypeError) as err:
            raise MetadataError(f"spot/instance-action: not the documented answer: {body[:200]!r}") from err
        return Notice("AWS", "spot notice", str(said.get("action", "terminate")), deadline)


class Gcp(Cloud):
    name, base_url = "GCP", "http://metadata.google.internal"

    @staticmethod
    def here(dmi: Path) -> bool:
        return _read(dmi, "product_name") == "Google Compute Engine" or _read(dmi, "sys_vendor") == "Google"

    def value(self, key: str) -> str:
        status, body = _ask("GET", f"{self.base}/computeMetadata/v1/instance/{key}", {"Metadata-Flavor": "Google"})
        if status != 200:
            raise MetadataError(f"instance/{key}: HTTP {status}")
        return body.decode(errors="replace").strip()

    def notice(self, host: str, now: float) -> Notice | None:
        if self.value("preempted") == "TRUE":
            return Notice("GCP", "preemption notice", "stop", now + NOTICE_S)
        if self.value("maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE":
            return Notice("GCP", "maintenance event", "terminate", now + NOTICE_S)
        return None


class Azure(Cloud):
    name, base_url = "Azure", "http://169.254.169.254"
    asset_tag = "7783-7084-3265-9085-8269-3286-77"

    def __init__(self, base_url: str | None = None):
        super().__init__(base_url)
        self.vm = ""

    @staticmethod
    def here(dmi: Path) -> bool:
        return _read(dmi, "chassis_asset_tag") == Azure.asset_tag

    def notice(self, host: str, now: float) -> Notice | None:
        if not self.vm:
            status, body = _ask("GET", f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
                                {"Metadata": "true"})
            if status != 200 or not body.strip():
                raise MetadataError(f"instance/compute/name: HTTP {status}")
            self.vm = body.decode().strip()
        status, body = _ask("GET", f"{self.base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        if status != 200:
            raise MetadataError(f"scheduledevents: HTTP {status}")
        try:
            events = json.loads(body)["Events"]
        except (ValueError, KeyError, TypeError) as err:
            raise MetadataError(f"scheduledevents: not the documented answer: {body[:200]!r}") from err
        for event in events:
            if event.get("EventType") in AZURE_LEAVES and self.vm in (event.get("Resources") or ()) \
                    and event.get("EventStatus") in ("Scheduled", "Started"):
                return Notice("Azure", "scheduled event", event["EventType"], _azure_time(event.get("NotBefore"), now))
        return None


def _azure_time(said: str | None, now: float) -> float:
    """NotBefore ("Mon, 19 Sep 2016 18:29:47 GMT"; empty once the event started) as a wall clock time."""
    try:
        return email.utils.parsedate_to_datetime(said).timestamp() if said else now
    except (TypeError, ValueError):
        return now + NOTICE_S


CLOUDS: dict[str, type[Cloud]] = {"aws": Aws, "gcp": Gcp, "azure": Azure}


def detect(dmi: str | Path | None = None) -> type[Cloud] | None:
    """The cloud this host is a VM of, from its DMI tables; None off a cloud."""
    root = Path(dmi or os.environ.get("TANDEM_TEST_DMI") or DMI)
    return next((cloud for cloud in CLOUDS.values() if cloud.here(root)), None)


class Watcher:
    """Asks `cloud`'s metadata server every `poll_s` in a thread of its own; `notice` is the first notice
    it heard (a notice is not taken back: the VM goes)."""

    def __init__(self, cloud: Cloud, host: str, poll_s: float = POLL_S, say=print):
        self.cloud, self.host, self.poll_s, self.say = cloud, host, poll_s, say
        self.notice: Notice | None = None
        self.error = ""
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="preemption")

    def start(self) -> Watcher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def poll(self) -> Notice | None:
        """One question to the metadata server; a failure is remembered (said once), never raised."""
        try:
            heard = self.cloud.notice(self.host, time.time())
        except Exception as err:  # noqa: BLE001 - a metadata server's fault never ends the keeper
            if str(err) != self.error:
                self.say(f"{self.cloud.name}'s metadata server did not answer ({err}): asked again every "
                         f"{self.poll_s:g} s")
            self.error = str(err)
            return None
        if self.error:
            self.say(f"{self.cloud.name}'s metadata server answers again")
        self.error = ""
        if heard is not None and self.notice is None:
            self.notice = heard
        return heard

    def _run(self) -> None:
        while not self.stopped.is_set() and self.notice is None:
            self.poll()
            self.stopped.wait(self.poll_s)


def watch(host: str, poll_s: float = POLL_S, say=print, dmi: str | Path | None = None) -> Watcher | None:
    """A started Watcher for this host's cloud, or None off a cloud (nothing polls there)."""
    cloud = detect(dmi)
    if cloud is None:
        return None
    return Watcher(cloud(os.environ.get("TANDEM_TEST_METADATA_URL")), host, poll_s, say).start()


# --- rank 0's save, now


def note_rank0(save_dir: str | Path) -> None:
    """Rank 0's fairseq process says where the keeper finds it (train.agent.trainer.fairseq_train)."""
    path = Path(save_dir) / RANK0_PID
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{RANK0_PID}.tmp")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)


def rank0_pid(run_dir: str | Path) -> int | None:
    """Rank 0's fairseq process on this host, when it runs (its pid file, checked against the run's
    processes: a pid reused by another process is not it)."""
    from train.agent.keeper.state import run_pids, save_dir

    try:
        pid = int((Path(save_dir(str(run_dir))) / RANK0_PID).read_text())
    except (OSError, ValueError):
        return None
    return pid if pid in run_pids(str(run_dir)) else None


def save_now(run_dir: str | Path) -> str:
    """Ask rank 0 to save checkpoint_last at the end of its current update. '' when asked, else why not."""
    pid = rank0_pid(run_dir)
    if pid is None:
        return "rank 0 has not finished an update since it started: its last checkpoint is the newest"
    try:
        os.kill(pid, SAVE_NOW_SIGNAL)
    except OSError as err:
        return f"rank 0 (pid {pid}) could not be signalled: {err}"
    return ""
