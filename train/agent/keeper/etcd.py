"""Agreement among three or more hosts, by etcd (Raft): who leads, and the one current generation.

With three hosts or more a run's first 3 (or 5) hosts each start an etcd member for the run (its data
in RUN/keeper/etcd/START/, on the cluster network at the keepers' port + 1 and + 2), started by the
keeper (`member_command`). Each `fab train` start forms a cluster of its own (a replaced VM changes
the members), its first generation numbered after the ones the hosts recorded. The members then
follow the hosts: the leader removes the member of a host unheard for long and adds a live host in
its place (`next_change`, `Agreement.follow`); each keeper asks etcd whether its host is a member
(`how_to_join`), so a majority of the run's hosts keeps the agreement through one loss after another. Every keeper talks
to etcd through its v3 JSON gateway (`/v3/kv/range`,
`/v3/kv/txn`, `/v3/lease/*`: keys and values base64; over mutual TLS, clients and peers alike showing
a certificate of the run's CA: train.agent.keeper.tls), its own member first:
- the *leader* is the keeper whose lease holds the key `leader`: a txn puts it with the keeper's
  lease only while the key does not exist (create_revision 0). A leader whose host is cut off from
  etcd's majority cannot keep its lease alive: it stops leading when the lease's time is up, and a
  host on the majority's side takes the key;
- the *generation* (train.agent.keeper.generation.Generation, JSON) is the key `generation`, written by
  compare-and-swap on its mod_revision: one agreed generation at a time, never two.
A side of a partition without etcd's majority can neither read nor write: its keepers start no
ranks. What the leader decides (who trains, from which checkpoint) stays train.agent.keeper.generation's;
two hosts have no majority and keep the heartbeats' rule (train.agent.keeper.generation's docstring).
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from train.agent.keeper import tls
from train.agent.keeper.generation import Generation

LEADER, GENERATION = "leader", "generation"
CLIENT_OFFSET, PEER_OFFSET = 1, 2  # etcd's ports: the keepers' heartbeat port + these
ADD_TRIES = 15  # a second apart: etcd takes a new member once its leader heard a majority for 5 s


class Unavailable(RuntimeError):
    """No etcd member answered with a majority behind it (this side of a partition, or none up yet)."""


def members(order: list[str]) -> list[str]:
    """The hosts that run an etcd member: the run's first 3, or 5 from five hosts on (an odd number:
    an even one adds no failure it survives)."""
    return list(order[: 5 if len(order) >= 5 else 3])


def uses_etcd(order: list[str]) -> bool:
    return len(order) >= 3


def start_key(spec: dict) -> str:
    """Each `fab train` start forms an etcd cluster of its own (its hosts may differ from the last
    start's: a replaced VM): its data directory and cluster token are named by the start."""
    return re.sub(r"[^0-9A-Za-z]", "-", str(spec.get("start") or "0"))


def peer_url(spec: dict, host: str) -> str:
    return f"{tls.scheme(spec)}://{spec['addresses'][host]}:{int(spec['port']) + PEER_OFFSET}"


def client_url(spec: dict, host: str) -> str:
    return f"{tls.scheme(spec)}://{spec['addresses'][host]}:{int(spec['port']) + CLIENT_OFFSET}"


def member_command(spec: dict, data_dir: str, etcd: str = "etcd", joining: str | None = None) -> list[str]:
    """The etcd member this host runs for the run (a host among `members`). `joining`: the cluster it
    joins as a new member (its --initial-cluster, the members' list after `member add`), where the
    run's cluster exists already and this host's data is gone (a new VM, a wiped disk)."""
    me = spec["me"]
    peer, client = peer_url(spec, me), client_url(spec, me)
    cluster = joining or ",".join(f"{h}={peer_url(spec, h)}" for h in members(spec["order"]))
    return [etcd, "--name", me, "--data-dir", data_dir, "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer, "--listen-client-urls", client, "--advertise-client-urls", client,
            "--initial-cluster", cluster, "--initial-cluster-state", "existing" if joining else "new",
            "--initial-cluster-token", f"tandem-{spec['run_id']}-{start_key(spec)}",
            # a few heartbeats on a LAN; elections within ~1 s of a member's loss
            # (no --log-level: etcd 3.3, Ubuntu 22.04's, does not know it)
            "--heartbeat-interval", "100", "--election-timeout", "1000", *tls.etcd_flags(spec)]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class Agreed:
    """The generation etcd holds now, and the revision to compare-and-swap it on."""

    generation: Generation | None
    revision: int  # its mod_revision; 0 when there is none yet


class Etcd:
    """A small etcd v3 client over its JSON gateway: the calls tandem makes, no more."""

    def __init__(self, endpoints: list[str], timeout_s: float = 2.0, context=None):
        # `context`: the run's mutual TLS (train.agent.keeper.tls), None for plain HTTP
        self.endpoints, self.timeout_s, self.context = list(endpoints), timeout_s, context
        self.api = "/v3"  # etcd 3.4+; 3.3 (Ubuntu 22.04's) serves the same calls under /v3beta

    def call(self, path: str, body: dict) -> dict:
        errors = []
        for endpoint in self.endpoints:
            request = urllib.request.Request(f"{endpoint}{self.api}{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as answer:
                    said = json.loads(answer.read())
            except urllib.error.HTTPError as err:
                if err.code == 404 and self.api == "/v3":
                    self.api = "/v3beta"
                    return self.call(path, body)
                errors.append(f"{endpoint}: HTTP {err.code} {err.reason}")
                continue
            except (OSError, ValueError) as err:  # refused, timed out (no quorum: a request waits)
                errors.append(f"{endpoint}: {type(err).__name__}: {err}")
                continue
            if self.endpoints[0] != endpoint:  # the next call goes where this one was answered
                self.endpoints.remove(endpoint)
                self.endpoints.insert(0, endpoint)
            return said.get("result", said)
        raise Unavailable("; ".join(errors) or "no etcd endpoint")

    def get(self, key: str) -> tuple[str | None, int]:
        """(the value, its mod_revision), (None, 0) when the key does not exist."""
        kvs = self.call("/kv/range", {"key": _b64(key)}).get("kvs") or []
        if not kvs:
            return None, 0
        return base64.b64decode(kvs[0].get("value", "")).decode(), int(kvs[0]["mod_revision"])

    def put_if(self, key: str, value: str, revision: int, lease: int | None = None) -> bool:
        """Put `value` if the key's mod_revision is still `revision` (0: the key does not exist)."""
        put = {"key": _b64(key), "value": _b64(value), **({"lease": str(lease)} if lease else {})}
        target = {"target": "CREATE", "create_revision": "0"} if revision == 0 else \
            {"target": "MOD", "mod_revision": str(revision)}
        said = self.call("/kv/txn", {"compare": [{"key": _b64(key), "result": "EQUAL", **target}],
                                        "success": [{"requestPut": put}]})
        return bool(said.get("succeeded"))

    def member_list(self) -> list[dict]:
        """The cluster's members: {ID, name ('' until it first started), peerURLs, clientURLs}."""
        return list(self.call("/cluster/member/list", {}).get("members") or [])

    def member_add(self, peer: str) -> list[dict]:
        """Add a member at `peer` (its etcd then starts with --initial-cluster-state existing); the members after."""
        return list(self.call("/cluster/member/add", {"peerURLs": [peer]}).get("members") or [])

    def member_remove(self, member_id: str) -> None:
        self.call("/cluster/member/remove", {"ID": str(member_id)})

    def grant(self, ttl_s: int) -> int:
        return int(self.call("/lease/grant", {"TTL": ttl_s})["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's time left in seconds after renewing it; 0 when it expired (then it is gone)."""
        return int(self.call("/lease/keepalive", {"ID": str(lease)}).get("TTL", 0))


def host_of(spec: dict, member: dict) -> str | None:
    """The run's host whose peer URL a listed member has (None: none of the run's)."""
    urls = member.get("peerURLs") or []
    return next((h for h in spec["order"] if peer_url(spec, h) in urls), None)


def listing(spec: dict, members: list[dict]) -> dict[str, bool]:
    """etcd's members as the run's hosts: host -> whether its member ever started (an added member is
    listed without a name until it does)."""
    out = {}
    for m in members:
        host = host_of(spec, m)
        if host is not None:
            out[host] = bool(m.get("name")) or bool(m.get("clientURLs"))
    return out


def next_change(listed: dict[str, bool], live: set[str], gone: set[str], order: list[str],
                size: int) -> tuple[str | None, str | None]:
    """The next change of etcd's membership that follows the run's hosts: (a member to remove, a host
    to add), either None. A member whose host is `gone` (unheard for long) makes room for a `live` host
    that is not a member; members are added up to `size` (3, or 5 from five hosts on). Never a change
    while an added member has not started yet, and never an add that would leave the started members
    short of a majority (etcd counts an added member toward its quorum at once): so one loss at a time,
    with the others still a majority, never costs the run its agreement."""
    if not all(listed.values()):
        return None, None  # an added member not started yet: wait for it
    members = list(listed)
    candidates = [h for h in order if h in live and h not in listed]
    remove = next((m for m in members if m in gone), None)
    after = [m for m in members if m != remove]
    if remove is not None and not candidates and len(after) < 3:
        remove = None  # nothing to take its place, and fewer than three would survive no loss
        after = members
    add = None
    if candidates and len(after) < size:
        started = [m for m in after if m in live]
        if 2 * len(started) > len(after) + 1:  # a majority of members and the added one
            add = candidates[0]
    return remove, add


def the_others(spec: dict, timeout_s: float = 2.0) -> Etcd:
    """A client of the run's etcd through every other host's member (this host's own may be the one gone)."""
    return Etcd([client_url(spec, h) for h in spec["order"] if h != spec["me"]], timeout_s, tls.client_context(spec))


def ask_members(spec: dict, timeout_s: float = 2.0) -> tuple[list[dict] | None, bool]:
    """(etcd's members as the other hosts' members list them, None where none answers; whether a majority
    stands behind the answer: a linearizable read). Every host is asked: members change."""
    cluster = the_others(spec, timeout_s)
    try:
        listed = cluster.member_list()
    except Unavailable:
        return None, False
    try:
        cluster.get(GENERATION)
        return listed, True
    except Unavailable:
        return listed, False


def joining_cluster(spec: dict, members: list[dict]) -> str:
    """--initial-cluster of a member joining the run's cluster: every listed member, named."""
    return ",".join(f"{m.get('name') or host_of(spec, m) or spec['me']}={(m.get('peerURLs') or [''])[0]}"
                    for m in members)


def how_to_join(spec: dict, has_data: bool, timeout_s: float = 2.0) -> tuple[bool, str | None]:
    """Whether this host runs an etcd member of the run now, and the --initial-cluster it joins with
    (None: it starts from its own data, or bootstraps the run's cluster with the others). Asked of etcd
    itself, since members follow the hosts (`next_change`):
    - not listed while etcd answers: removed (its host was gone) or never added: no member;
    - listed, never started: added by the leader (or late to the first start): joins with the list;
    - listed and started, its data gone (a new VM, a wiped disk): its old self removed and a new
      member added through the others (a majority must answer);
    - nobody answers: with its data, it starts again; without, only a first member bootstraps.
    Raises Unavailable where the cluster answers but takes no change yet (tried again later)."""
    me, mine = spec["me"], peer_url(spec, spec["me"])
    listed, quorate = ask_members(spec, timeout_s)
    if listed is None:
        return has_data or me in members(spec["order"]), None
    own = [m for m in listed if mine in (m.get("peerURLs") or [])]
    if not own:
        return False, None
    if not (own[0].get("name") or own[0].get("clientURLs")):  # listed, never started
        first = {peer_url(spec, h) for h in members(spec["order"])}
        if not quorate and {u for m in listed for u in m.get("peerURLs") or []} == first:
            return True, None  # the run's first start, its cluster not formed yet: bootstrapped with the others
        if not quorate:
            raise Unavailable(f"{me}: added to the run's etcd cluster, which has no majority to join yet")
        return True, joining_cluster(spec, listed)
    if has_data:
        return True, None
    cluster = the_others(spec, timeout_s)
    try:
        cluster.member_remove(own[0]["ID"])
    except Unavailable:
        return False, None
    for _ in range(ADD_TRIES):  # etcd refuses a change while its leader has not heard a majority for 5 s
        try:
            after = cluster.member_add(mine)
            break
        except Unavailable:
            time.sleep(1)
    else:
        # the cluster answered but took no new member: never bootstrap a cluster of its own beside it
        raise Unavailable(f"{me}: the run's etcd cluster answers but did not take this host as a new member")
    return True, joining_cluster(spec, after)


class Agreement:
    """One keeper's part in the agreement: its lease, whether it leads, the agreed generation."""

    def __init__(self, spec: dict):
        # every host's client port, its own and the first members' first: members follow the hosts
        first = members(spec["order"])
        hosts = sorted(spec["order"], key=lambda h: (h != spec["me"], h not in first))
        self.etcd = Etcd([client_url(spec, h) for h in hosts], context=tls.client_context(spec))
        self.spec, self.me = spec, spec["me"]
        self.ttl_s = max(2, int(float(spec.get("lost_after_s", 20)) / 2))
        self.lease: int | None = None

    def leads(self) -> bool:
        """Renew this keeper's lease and take the `leader` key when free. True while this keeper holds
        it and its lease is surely alive; False when another does or etcd cannot answer."""
        try:
            if self.lease is None or self.etcd.keepalive(self.lease) <= 0:
                self.lease = self.etcd.grant(self.ttl_s)
            holder, _ = self.etcd.get(LEADER)
            if holder is None and self.etcd.put_if(LEADER, self.me, 0, self.lease):
                holder = self.me
        except Unavailable:  # cut off from etcd's majority: never leads (it could not write anyway)
            return False
        return holder == self.me

    def current(self) -> Agreed:
        """The agreed generation. Unavailable when this side cannot reach etcd's majority."""
        value, revision = self.etcd.get(GENERATION)
        return Agreed(Generation.of(json.loads(value)) if value else None, revision)

    def propose(self, gen: Generation, revision: int) -> bool:
        """Make `gen` the agreed generation if none was agreed since `revision`."""
        return self.etcd.put_if(GENERATION, json.dumps(gen.to_dict()), revision)

    def follow(self, live: set[str], gone: set[str]) -> str | None:
        """The leader's part in etcd following the run's hosts: one change of the membership
        (`next_change`) through etcd's member API; what changed, said, or None."""
        remove = add = None
        said: list[str] = []
        try:
            listed = self.etcd.member_list()
            hosts = listing(self.spec, listed)
            remove, add = next_change(hosts, live, gone, self.spec["order"], len(members(self.spec["order"])))
            if remove is not None:
                self.etcd.member_remove(next(m["ID"] for m in listed if host_of(self.spec, m) == remove))
                said.append(f"{remove}'s member removed (its host unheard for long)")
            if add is not None:
                self.etcd.member_add(peer_url(self.spec, add))
                said.append(f"{add} added as a member (it starts its own)")
        except Unavailable as err:  # etcd takes a change once its leader heard a majority for 5 s: next round
            if remove is not None or add is not None:
                said.append(f"no more changed this round ({err})")
        return "etcd: " + "; ".join(said) if said else None

