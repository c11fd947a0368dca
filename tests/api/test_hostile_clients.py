"""Hostile clients against ``qoss serve`` as the README starts it (SQLite, the defaults; only the
deadlines shortened so that the suite takes seconds), all kinds at once in one run, loopback only.

While blank-line-only sockets, heads dripped a byte at a time, oversized heads (on a connection's
first request and on a later one), bodies that never finish, clients that never read their
answers, pipelined probes and half-closed sockets work on the server together, an ordinary
client asks for ``/v1/algorithms`` on a new connection again and again: every one of its
requests is answered 200 within 3 s, the server's RSS stays within a bound, and every hostile
socket is closed by the server by its deadline (seen without reading it: the socket's TCP state
leaves ESTABLISHED when the server's FIN or RST arrives).

Each hostile kind is bounded in count (:data:`PER_KIND` sockets) and time (:data:`RUN_FOR`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from app.web.deadlines import HEAD_MAX
from tests import REPO_ROOT
from tests.fixtures.served import serving

QOSS = Path(sys.executable).parent / "qoss"
#: Deadlines and "answered within 3 s" hold only with the machine to the suite alone.
pytestmark = pytest.mark.alone
SILENT, HEADER, BODY, SEND = 2.0, 3.0, 3.0, 3.0
#: What the server may take beyond a deadline to close (its timers, a machine busy with the suite).
SLACK = 4.0
#: Seconds the server may take to fill a never-reading client's buffers, its kernel's (megabytes on
#: loopback) and its own, before the send deadline starts.
FILL = 3.0
#: Sockets opened of each hostile kind.
PER_KIND = 12
#: Seconds the ordinary client goes on asking, and the most any hostile socket is watched.
RUN_FOR = SEND + FILL + 2 * SLACK + 4
#: The most the server's resident memory may grow during the run.
RSS_GROWTH = 64 * 1024 * 1024
_ESTABLISHED = 1  # linux/tcp_states.h; struct tcp_info starts with tcpi_state


@contextmanager
def _qoss_serve(where: Path, **settings: str) -> Iterator[tuple[str, int]]:
    """``qoss serve`` on SQLite in ``where``, the deadlines shortened, ``settings`` (QOSS_* variables) added."""
    env = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
           "QOSS_STATE_DIR": str(where / "state"),
           "QOSS_SILENT_TIMEOUT": str(SILENT), "QOSS_HEADER_TIMEOUT": str(HEADER),
           "QOSS_BODY_TIMEOUT": str(BODY), "QOSS_SEND_TIMEOUT": str(SEND), **settings,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)}
    with serving([str(QOSS), "serve", "--database-url", f"sqlite:///{where / 'qoss.db'}"], env=env,
                 log=where / "serve.log", cwd=where) as (base, proc):
        yield base, proc.pid


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with _qoss_serve(tmp_path_factory.mktemp("hostile")) as found:
        yield found


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _open(base: str, *, rcvbuf: int = 0) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:  # before connecting: the window the client offers stays this small
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    conn.settimeout(10)
    conn.connect((host, int(port)))
    return conn


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closed or reset ``conn`` (its FIN or RST arrived), without reading it."""
    return bool(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _ESTABLISHED)


def _read_answer(conn: socket.socket) -> bytes:
    """One whole answer (head and a Content-Length body) from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return head


@dataclass
class Hostile:
    """One hostile socket: what it does, the deadline by which the server must have closed it."""

    kind: str
    deadline: float
    act: Callable[[socket.socket, threading.Event], None]
    rcvbuf: int = 0
    closed_after: float | None = None
    error: str | None = None

    def run(self, base: str, stop: threading.Event) -> None:
        started = time.monotonic()
        try:
            conn = _open(base, rcvbuf=self.rcvbuf)
        except OSError as exc:
            self.error = f"connect: {exc}"
            return
        try:
            self.act(conn, stop)
            while not stop.is_set() and time.monotonic() - started < RUN_FOR:
                if _closed_by_server(conn):
                    self.closed_after = time.monotonic() - started
                    return
                time.sleep(0.05)
        except OSError:  # a send into a connection the server closed: closed now at the latest
            self.closed_after = time.monotonic() - started
        finally:
            conn.close()


def _dribble(data: bytes, every: float) -> Callable[[socket.socket, threading.Event], None]:
    """Send ``data`` a byte at a time, one every ``every`` seconds, until the server closes."""
    def act(conn: socket.socket, stop: threading.Event) -> None:
        for byte in data:
            if stop.is_set() or _closed_by_server(conn):
                return
            conn.send(bytes([byte]))
            time.sleep(every)
    return act


def _after_an_answer(then: Callable[[socket.socket, threading.Event], None]) -> Callable[
        [socket.socket, threading.Event], None]:
    """A normal request answered on the connection first, then ``then`` on the kept-alive connection."""
    def act(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"GET /livez HTTP/1.1\r\nHost: qoss\r\n\r\n")
        assert _read_answer(conn).startswith(b"HTTP/1.1 200 ")
        then(conn, stop)
    return act


def _oversized_head(conn: socket.socket, stop: threading.Event) -> None:
    """A head that never ends: up to 64 MiB of one header, until the server closes."""
    conn.sendall(b"GET /livez HTTP/1.1\r\nHost: qoss\r\nX-Big: ")
    chunk = b"a" * 65536
    for _ in range(1024):
        if stop.is_set():
            return
        conn.sendall(chunk)


def _send(data: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def act(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
    return act


def _half_close(data: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def act(conn: socket.socket, stop: threading.Event) -> None:
        if data:
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
    return act


def _pipelined_probe(conn: socket.socket, stop: threading.Event) -> None:
    """A probe with an ordinary request behind it: both answered, in order, then the connection idles."""
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: qoss\r\n\r\nGET /v1/algorithms HTTP/1.1\r\nHost: qoss\r\n\r\n")
    assert _read_answer(conn).startswith(b"HTTP/1.1 200 ")
    assert _read_answer(conn).startswith(b"HTTP/1.1 200 ")
    conn.sendall(b"\r\n")  # and then only an empty line: the next head's deadline holds it


_BUNDLE = b"GET /docs/static/swagger-ui-bundle.js HTTP/1.1\r\nHost: qoss\r\n\r\n"
#: About 100 KB: 40 of them pipelined are more than the kernel's buffers hold.
_SCHEMA = b"GET /openapi.json HTTP/1.1\r\nHost: qoss\r\n\r\n"


def _hostiles() -> list[Hostile]:
    kinds = [
        Hostile("blank lines only", SILENT, _dribble(b"\r\n" * 40, 0.2)),
        Hostile("blank lines after a kept-alive answer", HEADER, _after_an_answer(_dribble(b"\r\n" * 40, 0.2))),
        Hostile("head dripped a byte at a time", HEADER, _dribble(b"GET /v1/algorithms HTTP/1.1\r\nHost: q\r\n", 0.2)),
        Hostile("oversized first head", 0.0, _oversized_head),
        Hostile("oversized later head", 0.0, _after_an_answer(_oversized_head)),
        Hostile("body that never finishes", BODY, _send(
            b"POST /v1/negotiations HTTP/1.1\r\nHost: qoss\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"peers\": ")),
        Hostile("never reads a static file", SEND + FILL, _send(_BUNDLE * 3), rcvbuf=4096),
        Hostile("never reads an API answer", SEND + FILL, _send(_SCHEMA * 40), rcvbuf=4096),
        Hostile("pipelined probe", HEADER, _pipelined_probe),
        Hostile("half-closed in its head", 0.0, _half_close(b"GET /v1/algor")),
        Hostile("half-closed before anything", 0.0, _half_close(b"")),
    ]
    return [Hostile(h.kind, h.deadline, h.act, h.rcvbuf) for h in kinds for _ in range(PER_KIND)]


@dataclass
class Ordinary:
    """The ordinary client's requests: their status codes and latencies (seconds)."""

    answers: list[tuple[int, float]] = field(default_factory=list)
    rss_peak: int = 0

    def run(self, base: str, pid: int, stop: threading.Event) -> None:
        until = time.monotonic() + RUN_FOR
        while not stop.is_set() and time.monotonic() < until:
            started = time.monotonic()
            try:
                status = httpx.get(f"{base}/v1/algorithms", timeout=3, headers={"Connection": "close"}).status_code
            except httpx.HTTPError:
                status = 0
            self.answers.append((status, time.monotonic() - started))
            self.rss_peak = max(self.rss_peak, _rss(pid))
            time.sleep(0.05)


def test_ordinary_requests_are_answered_while_every_hostile_kind_is_closed_by_its_deadline(
        served: tuple[str, int]) -> None:
    base, pid = served
    before = _rss(pid)
    stop = threading.Event()
    hostiles = _hostiles()
    ordinary = Ordinary()
    threads = [threading.Thread(target=h.run, args=(base, stop), daemon=True) for h in hostiles]
    threads.append(threading.Thread(target=ordinary.run, args=(base, pid, stop), daemon=True))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=RUN_FOR + 10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert not [t for t in threads if t.is_alive()], "a client did not stop"

    late = {}
    for h in hostiles:
        if h.error is not None or h.closed_after is None or h.closed_after > h.deadline + SLACK:
            late.setdefault(h.kind, []).append(h.error or h.closed_after)
    assert not late, f"hostile sockets not closed by their deadline (+{SLACK:g} s): {late}"

    assert len(ordinary.answers) >= 10, ordinary.answers
    refused = [a for a in ordinary.answers if a[0] != 200 or a[1] >= 3.0]
    assert not refused, f"ordinary requests not answered 200 within 3 s: {refused}"
    assert ordinary.rss_peak - before < RSS_GROWTH, (before, ordinary.rss_peak)
    assert httpx.get(f"{base}/healthz", timeout=3).status_code == 200


def test_a_later_head_over_the_limit_is_431_on_a_kept_alive_connection(served: tuple[str, int]) -> None:
    base, _ = served
    conn = _open(base)
    try:
        conn.sendall(b"GET /livez HTTP/1.1\r\nHost: qoss\r\n\r\n")
        assert _read_answer(conn).startswith(b"HTTP/1.1 200 ")
        conn.sendall(b"GET /livez HTTP/1.1\r\nHost: qoss\r\nX-Big: " + b"a" * (HEAD_MAX + 1) + b"\r\n\r\n")
        assert _read_answer(conn).startswith(b"HTTP/1.1 431 ")
    finally:
        conn.close()


def test_an_answer_nobody_reads_frees_its_place_for_requests_in_flight(tmp_path: Path) -> None:
    """Requests in flight are counted until their answer is whole, not until the client has it:
    more never-reading clients of an API answer than there are places leave the places free."""
    with _qoss_serve(tmp_path, QOSS_MAX_IN_FLIGHT="4", QOSS_SEND_TIMEOUT="60") as (base, _):
        conns = [_open(base, rcvbuf=4096) for _ in range(8)]  # twice the places
        try:
            for conn in conns:
                conn.sendall(_SCHEMA * 40)
            time.sleep(1.0)  # each answering, its client reading nothing
            answers = []
            for _ in range(6):  # over three seconds, none of them late or refused
                answers.append((httpx.get(f"{base}/v1/algorithms", timeout=3).status_code,
                                httpx.get(f"{base}/healthz", timeout=3).status_code))
                time.sleep(0.5)
            assert answers == [(200, 200)] * 6
            assert not any(_closed_by_server(c) for c in conns)  # still waiting, before the send deadline
        finally:
            for conn in conns:
                conn.close()


def test_bodies_that_never_finish_hold_no_place_for_requests_in_flight(tmp_path: Path) -> None:
    """A request takes its place once its whole body is in: more unfinished bodies than there are
    places leave every place free, and each is closed at the body deadline."""
    with _qoss_serve(tmp_path, QOSS_MAX_IN_FLIGHT="4") as (base, _):
        conns = [_open(base) for _ in range(8)]  # twice the places
        try:
            for conn in conns:
                conn.sendall(b"POST /v1/negotiations HTTP/1.1\r\nHost: qoss\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{\"peers\": ")
            time.sleep(1.0)
            answers = []
            for _ in range(4):
                answers.append((httpx.get(f"{base}/v1/algorithms", timeout=3).status_code,
                                httpx.get(f"{base}/healthz", timeout=3).status_code))
                time.sleep(0.3)
            assert answers == [(200, 200)] * 4
            deadline = time.monotonic() + BODY + SLACK
            while not all(_closed_by_server(c) for c in conns) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert all(_closed_by_server(c) for c in conns)
        finally:
            for conn in conns:
                conn.close()


def test_the_suites_tcp_state_reading_sees_a_close(served: tuple[str, int]) -> None:
    """The suite's way of seeing the server's close without reading works on this kernel."""
    base, _ = served
    conn = _open(base)
    try:
        conn.sendall(b"GET /livez HTTP/1.1\r\nHost: qoss\r\nConnection: close\r\n\r\n")
        deadline = time.monotonic() + 5
        while not _closed_by_server(conn) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _closed_by_server(conn)
    finally:
        conn.close()
