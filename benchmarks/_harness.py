"""Shared by the tunnel benchmarks: a lab (two charons in netns) and a real qoss under uvicorn.

Everything is torn down on exit, also on failure: the server, the charons, the namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.adapters.vici.session import unix_connect  # noqa: E402
from app.lab.hosts import Lab  # noqa: E402


@dataclass
class Service:
    base_url: str
    pid: int
    lab: Lab
    db_url: str
    headers: dict[str, str]

    def rss_kib(self) -> int:
        return rss_kib(self.pid)


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid`` (``VmRSS``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _stat_cpu(stat: Path) -> float:
    """User + system CPU time in a ``/proc/.../stat`` file, in seconds (the fields after the
    command name, which may itself hold spaces and parentheses)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, in seconds."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def machine_seconds() -> tuple[float, float]:
    """The machine's CPU time so far, all cores together, from ``/proc/stat``: (busy, idle)
    seconds. Busy is user, nice, system, interrupts and steal; idle is idle and I/O wait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, (idle + iowait) / tick


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each thread of process ``pid`` so far, in seconds, by thread id
    (a thread that ends between the listing and its read is left out)."""
    threads: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads[int(task.name)] = _stat_cpu(task / "stat")
        except OSError:
            continue
    return threads


def prepared_database(db_url: str, name: str = "bench", env: Mapping[str, str] | None = None) -> str:
    """Migrate the database at ``db_url`` and load the shipped data it lacks (as ``qoss db
    upgrade`` does), then make an admin token ``name`` in it as this machine's operator (as
    ``qoss token create`` does on a database with none yet); the token. The settings are read
    from this process's environment with ``env`` over it."""
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for, prepare_database
    from app.lab.bench import unit_of_work
    from app.services.auth import create_first_token
    from app.settings import Settings

    with mock.patch.dict(os.environ, env or {}):
        settings = Settings(database_url=db_url)
    prepare_database(settings)
    engine = engine_for(settings)
    try:
        with unit_of_work(make_session_factory(engine)) as uow:
            token, _ = create_first_token(uow=uow, name=name, scopes=["admin"], expires_in=None,
                                          created_by=f"local:{getpass.getuser()}")
    finally:
        engine.dispose()
    return token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_qoss(env: Mapping[str, str], log: Path, port: int | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """``qoss serve`` of this checkout on a loopback port (free, unless given) with ``env``, its
    errors in ``log``; its base URL and process once it answers ``/livez`` (60 s at most)."""
    port = port or _free_port()
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)], cwd=ROOT,
                                  env=dict(env), stdout=subprocess.DEVNULL, stderr=out)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/livez", timeout=1).status_code == 200:
                return base, server
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"qoss did not start; see {log}")


@contextlib.contextmanager
def lab_and_service(env: dict[str, str] | None = None) -> Iterator[Service]:
    """A lab of two charons and a ``qoss serve`` on SQLite with both registered as gateways;
    ``env`` adds to (or overrides) the server's environment."""
    state = Path(tempfile.mkdtemp(prefix="qoss-bench-", dir="/tmp"))
    lab = Lab(state / "lab", prefix=f"qb{os.getpid() % 10000}-{uuid.uuid4().hex[:3]}")
    server: subprocess.Popen[bytes] | None = None
    try:
        lab.up()
        port = _free_port()
        db_url = f"sqlite:///{state}/qoss.db"
        token = prepared_database(db_url)
        env = {
            **os.environ,
            "QOSS_DATABASE_URL": db_url,
            "QOSS_LOG_LEVEL": "warning",
            "QOSS_RECONCILE_ON_START": "false",
            # The benchmarks measure set-up, not the per-token limit (20/s by default).
            "QOSS_TUNNEL_RATE": "100000",
            "QOSS_TUNNEL_BURST": "100000",
            "QOSS_VICI_SOCKET_DIRS": f'["{state}"]',
            **(env or {}),
        }
        base, server = serve_qoss(env, state / "server.log", port)
        headers = {"Authorization": f"Bearer {token}"}
        for host in lab.hosts:
            r = httpx.post(f"{base}/v1/gateways", json={
                "name": host.name, "vici_socket": host.vici_socket, "ike_address": host.ike_address,
                "inside_networks": [f"{host.inside_address}/32"],
            }, headers=headers, timeout=10)
            r.raise_for_status()
        yield Service(base, server.pid, lab, db_url, headers)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        lab.down()
        shutil.rmtree(state, ignore_errors=True)


def left_sources(svc: Service, count: int) -> list[str]:
    """``count`` addresses (10.10.x.y) on the left host, one for each tunnel to protect as its
    own /32: kernel-libipsec installs a policy only for a local source address."""
    sources = [f"10.10.{i // 250}.{i % 250 + 1}" for i in range(count)]
    left = svc.lab.host("left")
    batch = "".join(f"addr add {a}/32 dev lo\n" for a in sources)
    subprocess.run(["ip", "-n", left.netns, "-batch", "-"], input=batch, text=True, check=True, timeout=120)
    # charon learns addresses from netlink events; a burst of 1,000 overflows its socket and
    # some are lost ("no local address found in traffic selector"). Restarting it makes it
    # read the whole list.
    svc.lab.stop_charon("left")
    svc.lab.start_charon("left")
    return sources


class ThreadClients:
    """One kept-alive httpx client per worker thread, on ``svc`` with its token; :meth:`close` closes all."""

    def __init__(self, svc: Service, timeout: float) -> None:
        self._svc, self._timeout = svc, timeout
        self._local = threading.local()
        self._all: list[httpx.Client] = []
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(base_url=self._svc.base_url, timeout=self._timeout, headers=self._svc.headers)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        for client in self._all:
            client.close()


@dataclass(frozen=True)
class Reply:
    """An answer read by :class:`LeanConnection`: status, headers (names lower-case), body."""

    status: int
    headers: dict[str, str]
    body: bytes


class LeanConnection:
    """One kept-alive HTTP/1.1 connection on asyncio for load: each request in one write, the
    answer read by its ``Content-Length`` (every answer of qoss's API has one). A fraction of
    httpx's CPU per request, so that on a small machine the load generator takes little of the
    CPU the server under test needs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                 headers: Mapping[str, str]) -> None:
        self._reader, self._writer = reader, writer
        self._fixed = f"host: {host}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())

    @classmethod
    async def open(cls, base_url: str, headers: Mapping[str, str]) -> LeanConnection:
        host = base_url.split("://", 1)[1].rstrip("/")
        address, port = host.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(address, int(port))
        return cls(reader, writer, host, headers)

    async def request(self, method: str, path: str, body: bytes | None = None) -> Reply:
        head = f"{method} {path} HTTP/1.1\r\n{self._fixed}"
        if body is not None:
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        self._writer.write((head + "\r\n").encode("latin-1") + (body or b""))
        lines = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise RuntimeError(f"an answer with transfer-encoding {headers['transfer-encoding']}: not read here")
        length = int(headers.get("content-length", "0"))
        data = await self._reader.readexactly(length) if length else b""
        if headers.get("connection", "").lower() == "close":
            raise RuntimeError(f"the server closed the connection after {status}")
        return Reply(status, headers, data)

    def close(self) -> None:
        self._writer.close()


def lean_parallel(svc: Service, concurrency: int, jobs: list[Callable[[LeanConnection], Awaitable[None]]],
                  deadline: float) -> tuple[float, list[str]]:
    """Run ``jobs`` ``concurrency`` at a time on one event loop in this thread, each on one of
    ``concurrency`` :class:`LeanConnection` s (opened before the clock starts); seconds from the
    first start to the last end, and the errors (a job not started by ``deadline``, a
    ``time.monotonic()``, is one). A connection whose job failed is opened anew."""
    errors: list[str] = []

    async def run() -> float:
        pending = iter(jobs)
        conns = [await LeanConnection.open(svc.base_url, svc.headers) for _ in range(concurrency)]

        async def worker(conn: LeanConnection) -> None:
            for job in pending:
                if time.monotonic() > deadline:
                    errors.append("time budget reached: not started")
                    continue
                try:
                    await asyncio.wait_for(job(conn), 120)
                except Exception as exc:  # counted and printed; the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    conn.close()
                    conn = await LeanConnection.open(svc.base_url, svc.headers)
            conn.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        return time.perf_counter() - t0

    return asyncio.run(run()), errors


def all_tunnels(client: httpx.Client) -> tuple[list[dict[str, Any]], int]:
    """Every tunnel, walking ``GET /v1/tunnels`` a page of 1,000 at a time; and the bytes read."""
    found: list[dict[str, Any]] = []
    read = 0
    url: str | None = "/v1/tunnels?limit=1000"
    while url is not None:
        answer = client.get(url)
        answer.raise_for_status()
        found += answer.json()
        read += len(answer.content)
        url = answer.links.get("next", {}).get("url")
    return found, read


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def open_session(path: str, stack: contextlib.ExitStack) -> Any:
    """A VICI session (the ``vici`` package's) on ``path``; charon's listen queue is short, so a
    refused connect is tried again."""
    for attempt in range(100):
        try:
            return stack.enter_context(unix_connect(path, 60))
        except BlockingIOError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError(f"cannot connect to {path}")


class UpWatch:
    """Which conns have their CHILD_SA up on a charon: a VICI session of its own registered for
    ``child-updown``; :meth:`wait` returns once the conn's CHILD_SA came up."""

    def __init__(self, path: str) -> None:
        self._stack = contextlib.ExitStack()
        self._session = open_session(path, self._stack)
        self._up: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._registered = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._registered.wait(10):
            raise RuntimeError("the event listener did not start")

    def _event(self, name: str) -> threading.Event:
        with self._lock:
            return self._up.setdefault(name, threading.Event())

    def _run(self) -> None:
        for kind, message in self._session.listen(["child-updown"], timeout=0.1):
            self._registered.set()
            if self._stop.is_set():
                break
            if kind is None or message.get("up") != b"yes":
                continue
            for name, body in message.items():
                if isinstance(body, dict):
                    self._event(name).set()

    def wait(self, name: str, timeout: float) -> bool:
        return self._event(name).wait(timeout)

    def forget(self, name: str) -> None:
        """Wait for ``name`` afresh: its next ``child-updown`` (up) is the one :meth:`wait` waits for."""
        self._event(name).clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._stack.close()
