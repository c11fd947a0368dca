"""Three ``qoss serve`` replicas on one PostgreSQL behind a real HAProxy: one leader at a time
with failover when it dies, an edit on one replica used by the next negotiation on every
other, events fanned out to the followers of every replica, and the load balancer's clients
answered while a replica is killed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import prepare_database
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.db import postgres_database
from tests.fixtures.figures import figure
from tests.fixtures.served import free_port, serving
from tests.fixtures.waiting import until
from tests.integration.charon.conftest import temporary_lab

pytestmark = pytest.mark.postgres

TABLE = "/v1/rating-tables/standards-2026"
STRONG = {"peers": [{"name": "a", "min_levels": {"confidentiality": 8, "integrity": 8}}]}


@contextlib.contextmanager
def haproxy(tmp_path: Path, backends: list[str]) -> Iterator[str]:
    """HAProxy (Debian's) in front of ``backends``: round robin, /livez checks every 200 ms,
    a failed connection tried again on another replica."""
    port = free_port()
    servers = "\n".join(f"    server r{i} {b.removeprefix('http://')} check inter 200 fall 1 rise 1"
                        for i, b in enumerate(backends))
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"""global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch
    retry-on conn-failure empty-response response-timeout
frontend qoss
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /livez
{servers}
""")
    with (tmp_path / "haproxy.log").open("wb") as log:
        proc = subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f", str(config)],
                                stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        up = until(lambda: httpx.get(f"{base}/livez", timeout=1).status_code == 200, 15, ignoring=(httpx.HTTPError,))
        assert up, (tmp_path / "haproxy.log").read_text()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_replicas_share_one_database_behind_a_load_balancer(tmp_path: Path) -> None:
    with postgres_database() as url, contextlib.ExitStack() as stack:
        prepare_database(Settings(database_url=url))
        admin = make_token(url, "replicas-admin", ["admin"])
        auth = {"Authorization": f"Bearer {admin}"}
        env = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
               "QOSS_LEADER_INTERVAL": "0.5", "QOSS_NEGOTIATION_RATE": "100000", "QOSS_NEGOTIATION_BURST": "100000",
               "QOSS_NEGOTIATION_TOTAL_RATE": "100000", "QOSS_NEGOTIATION_TOTAL_BURST": "100000"}
        replicas = [stack.enter_context(serving([sys.executable, "-m", "app.cli", "serve", "--database-url", url],
                                                cwd=REPO_ROOT, env=env, log=tmp_path / f"replica-{i}.log"))
                    for i in range(3)]
        bases = [base for base, _ in replicas]
        lb = stack.enter_context(haproxy(tmp_path, bases))

        def leaders() -> list[int]:
            return [i for i, b in enumerate(bases) if replicas[i][1].poll() is None
                    and httpx.get(f"{b}/healthz", timeout=2).json()["leader"]]

        assert leaders() == [0]  # the first to start leads; the others wait

        # An edit through the load balancer is used by the very next negotiation on every replica.
        chosen = httpx.post(f"{bases[1]}/v1/negotiations", json=STRONG, timeout=10).json()["suite"]["encryption"]
        follow = stack.enter_context(httpx.stream("GET", f"{bases[2]}/v1/events", headers=auth,
                                                  timeout=httpx.Timeout(5, read=15)))
        lines = follow.iter_lines()
        revision = httpx.get(f"{lb}{TABLE}", timeout=10).headers["ETag"]
        edited = httpx.patch(f"{lb}{TABLE}/ratings/{chosen}", json={"confidentiality": 3},
                             headers={**auth, "If-Match": revision}, timeout=10)
        assert edited.status_code == 200, edited.text
        for base in bases:
            again = httpx.post(f"{base}/v1/negotiations", json=STRONG, timeout=10).json()
            assert again["suite"]["encryption"] != chosen, base
        # ... and its event reaches the followers of another replica.
        event = next(json.loads(line[6:]) for line in lines if line.startswith("data: ")
                     and json.loads(line[6:])["kind"] == "rating_table.revision")
        assert (event["subject"], event["data"]["revision"]) == ("standards-2026", edited.json()["revision"])

        # Clients of the load balancer keep being answered while the leader is killed.
        def ask(i: int) -> int | str:
            if i == 60:
                replicas[0][1].send_signal(signal.SIGKILL)
            try:
                return httpx.post(f"{lb}/v1/negotiations", json=STRONG, timeout=15).status_code
            except httpx.HTTPError as e:
                return f"{type(e).__name__}: {e}"
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(ask, range(180)))
        # A request whose answer was part-way out when its replica died can only see the connection
        # close (the load balancer cannot send it again once a byte of the answer has passed); no
        # request waits for its time-out, and any other failure is a status.
        dropped = [s for s in statuses if isinstance(s, str)]
        assert not [s for s in dropped if "Timeout" in s], dropped
        failed = [s for s in statuses if s != 200]
        assert len(failed) <= 8, failed  # at most the requests in flight on the killed replica at that moment
        assert until(lambda: len(leaders()) == 1 and leaders()[0] in (1, 2), 10, ignoring=(httpx.HTTPError,)), leaders()
        assert all(httpx.post(f"{lb}/v1/negotiations", json=STRONG, timeout=10).status_code == 200
                   for _ in range(20))


TUNNELS = 300  # enough that the kill (at a third) lands among requests in flight on every replica


@dataclass
class Follower:
    """A client of ``GET /v1/events`` that leaves part-way and comes back with Last-Event-ID."""

    ids: list[int] = field(default_factory=list)
    reconnects: int = 0
    error: str | None = None

    def follow(self, urls: list[str], auth: dict[str, str], leave: threading.Event, until_id: list[int],
               stop: threading.Event) -> None:
        try:
            headers = dict(auth)
            for n in range(2):  # once on one replica, then again (after leaving) through the load balancer
                with httpx.stream("GET", urls[n], params={} if self.ids else {"after": "0"}, headers=headers,
                                  timeout=httpx.Timeout(5, read=30)) as stream:
                    for line in stream.iter_lines():
                        if line.startswith("id: "):
                            self.ids.append(int(line[4:]))
                        if n == 0 and leave.is_set():
                            break
                        if n == 1 and (stop.is_set() or (until_id and self.ids and self.ids[-1] >= until_id[0])):
                            return
                headers = {**auth, "Last-Event-ID": str(self.ids[-1])}
                self.reconnects += 1
        except Exception as exc:  # reported by the test, with what was read
            self.error = f"{type(exc).__name__}: {exc}"


@pytest.mark.charon
def test_tunnels_and_edits_through_three_replicas_one_killed_mid_run(tmp_path: Path) -> None:
    """300 tunnel requests (8 clients, each retrying with its Idempotency-Key) and concurrent rating
    edits through HAProxy; the leader is killed part-way. Every request ends with its tunnel or a
    clear error, no tunnel twice, no conn in charon without its record after a reconcile, every
    acknowledged edit in the history, a new leader within 10 s, and a follower that leaves and
    comes back with Last-Event-ID gets every event."""
    with postgres_database() as url, temporary_lab("qr") as lab, contextlib.ExitStack() as stack:
        prepare_database(Settings(database_url=url))
        auth = {"Authorization": f"Bearer {make_token(url, 'replicas-admin', ['admin'])}"}
        left, right = lab.host("left"), lab.host("right")
        sources = [f"10.10.{i // 250}.{i % 250 + 1}" for i in range(TUNNELS)]
        subprocess.run(["ip", "-n", left.netns, "-batch", "-"], input="".join(
            f"addr add {a}/32 dev lo\n" for a in sources), text=True, check=True, timeout=60)
        lab.stop_charon("left")  # charon reads every address at start (a burst of netlink events can be lost)
        lab.start_charon("left")
        env = {**os.environ, "QOSS_RECONCILE_ON_START": "false", "QOSS_LEADER_INTERVAL": "0.5",
               "QOSS_VICI_SOCKET_DIRS": json.dumps([str(lab.state_dir)]), "QOSS_IDEMPOTENCY_LEASE": "5",
               "QOSS_TUNNEL_RATE": "100000", "QOSS_TUNNEL_BURST": "100000", "QOSS_LOG_LEVEL": "warning"}
        replicas = [stack.enter_context(serving([sys.executable, "-m", "app.cli", "serve", "--database-url", url],
                                                cwd=REPO_ROOT, env=env, log=tmp_path / f"replica-{i}.log"))
                    for i in range(3)]
        bases = [base for base, _ in replicas]
        lb = stack.enter_context(haproxy(tmp_path, bases))
        for host in (left, right):
            r = httpx.post(f"{lb}/v1/gateways", headers=auth, timeout=10, json={
                "name": host.name, "vici_socket": host.vici_socket, "ike_address": host.ike_address,
                "inside_networks": [f"{host.inside_address}/32"]})
            assert r.status_code == 201, r.text

        follower, leave, stop = Follower(), threading.Event(), threading.Event()
        last_event: list[int] = []
        following = threading.Thread(target=follower.follow, args=(
            [f"{bases[2]}/v1/events", f"{lb}/v1/events"], auth, leave, last_event, stop))
        following.start()
        killed_at: list[float] = []
        new_leader_after: list[float] = []

        def watch_leader() -> None:
            while not killed_at and not stop.is_set():
                time.sleep(0.05)
            while not stop.is_set() and killed_at and time.monotonic() - killed_at[0] < 30:
                for base in bases[1:]:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        if httpx.get(f"{base}/healthz", timeout=2).json()["leader"]:
                            new_leader_after.append(time.monotonic() - killed_at[0])
                            return
                time.sleep(0.1)
        watching = threading.Thread(target=watch_leader)
        watching.start()

        def create(i: int) -> tuple[int, str | None, list[object]]:
            """Ask until the tunnel is made or a clear, final error (bounded in time)."""
            if i == TUNNELS // 3:
                replicas[0][1].send_signal(signal.SIGKILL)
                killed_at.append(time.monotonic())
                leave.set()
            body = {"initiator": "left", "responder": "right", "local_ts": [f"{sources[i]}/32"],
                    "remote_ts": [f"{right.inside_address}/32"]}
            tries: list[object] = []
            deadline = time.monotonic() + 120
            while True:
                try:
                    r = httpx.post(f"{lb}/v1/tunnels", json=body, timeout=60,
                                   headers={**auth, "Idempotency-Key": f"replicas-{i}"})
                except httpx.HTTPError as exc:  # the answer was on its way out of the killed replica
                    tries.append(type(exc).__name__)
                else:
                    tries.append(r.status_code)
                    if r.status_code == 201:
                        return i, r.json()["id"], tries
                    # A clear error: qoss's JSON, or the load balancer's own page when the replica
                    # it chose died with the request (HAProxy's 502, 503 or 504), never a bare failure.
                    if r.headers.get("content-type") == "application/json":
                        assert r.json()["error"], r.text
                    else:
                        assert r.status_code in (502, 503, 504), (r.status_code, r.text)
                    if r.status_code not in (409, 502, 503, 504):  # in progress, its replica died, or busy
                        return i, None, tries
                if time.monotonic() > deadline:
                    return i, None, tries
                time.sleep(0.3)

        table = "/v1/rating-tables/esaf-2006"
        algorithms = [r["algorithm"] for r in httpx.get(f"{lb}{table}", timeout=10).json()["ratings"]][:2]
        acknowledged: list[tuple[int, str, str]] = []

        def edit(who: int) -> None:
            for n in range(10):
                reason = f"edit {who}-{n}"
                for _ in range(100):  # a stale revision (the other editor was first) or a dead replica: again
                    try:
                        current = httpx.get(f"{lb}{table}", timeout=10)
                        if current.status_code != 200:  # the load balancer's 503 while a replica is down
                            assert current.status_code in (502, 503), current.text
                            time.sleep(0.1)
                            continue
                        revision = current.headers["ETag"]
                        r = httpx.patch(f"{lb}{table}/ratings/{algorithms[who]}", json={"reason": reason},
                                        headers={**auth, "If-Match": revision}, timeout=10)
                    except httpx.HTTPError:
                        continue
                    if r.status_code == 200:
                        acknowledged.append((r.json()["revision"], algorithms[who], reason))
                        break
                    assert r.status_code in (409, 412, 502, 503), r.text
                time.sleep(0.2)

        with ThreadPoolExecutor(max_workers=10) as pool:
            editors = [pool.submit(edit, who) for who in (0, 1)]
            results = list(pool.map(create, range(TUNNELS)))
            for e in editors:
                e.result()

        # Every request: its tunnel, or a clear error; none twice.
        made = {i: tid for i, tid, _ in results if tid is not None}
        assert len(made) == TUNNELS, [(i, tries) for i, tid, tries in results if tid is None][:10]
        records = httpx.get(f"{lb}/v1/tunnels?limit=1000", headers=auth, timeout=30).json()
        assert sorted(r["id"] for r in records) == sorted(made.values())
        assert len({tuple(r["local_ts"]) for r in records}) == TUNNELS
        # No conn in a charon without its record once the leader has reconciled.
        conns = {r["conn"] for r in records}
        orphans = {c for c in ViciGateway(left.vici_socket, 30).list_conns() if c.startswith("qoss-")} - conns
        reconciled = httpx.post(f"{lb}/v1/tunnels/reconcile", headers=auth, timeout=120)
        assert reconciled.status_code == 200, reconciled.text
        for host in (left, right):
            loaded = {c for c in ViciGateway(host.vici_socket, 30).list_conns() if c.startswith("qoss-")}
            assert loaded == conns, (host.name, sorted(loaded ^ conns)[:10])
        # No lost update: every acknowledged edit is its own revision, and that revision holds it.
        assert len(acknowledged) == 20
        assert len({rev for rev, _, _ in acknowledged}) == 20
        for rev, algorithm, reason in acknowledged:
            doc = httpx.get(f"{lb}{table}/revisions/{rev}", headers=auth, timeout=10).json()
            assert {r["algorithm"]: r.get("reason") for r in doc["ratings"]}[algorithm] == reason, rev
        # A new leader within 10 s.
        watching.join(35)
        assert new_leader_after, "no replica took the lead within 30 s"
        assert new_leader_after[0] <= 10, new_leader_after
        # The follower that left and came back misses nothing.
        engine = create_engine(url)
        try:
            with engine.connect() as c:
                every = [int(i) for i in c.execute(text("SELECT id FROM events ORDER BY id")).scalars()]
        finally:
            engine.dispose()
        last_event.append(every[-1])
        following.join(60)
        stop.set()
        assert follower.error is None, follower.error
        assert follower.reconnects >= 1
        assert sorted(set(follower.ids)) == every, sorted(set(every) - set(follower.ids))[:10]
        retried = [t for _, _, t in results if len(t) > 1]
        figure("replicas, the leader killed part-way", (
            f"{TUNNELS} tunnel requests and 20 rating edits through HAProxy to 3 replicas, all made once; "
            f"{len(retried)} retried by their client (e.g. {retried[:3]}); {len(orphans)} conns the killed replica "
            f"left in charon removed by reconcile; new leader after {new_leader_after[0]:.1f} s; "
            f"{len(every)} events followed across a reconnect, none missed"))
