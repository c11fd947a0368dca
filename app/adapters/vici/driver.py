"""The VICI driver: one strongSwan charon driven through its UNIX socket.

:class:`ViciGateway` wraps the ``vici`` package (strongSwan's own client). Every
operation takes a connection of its own: an idle one from a small per-socket pool
(:class:`SessionPool`) or a new one, so one caller at a time uses a connection and a
gateway object may be shared between threads. Streamed replies
(``initiate``, ``terminate``, ``list-sas``, ``list-conns``) are always consumed to the
end. Replies are decoded once into the dataclasses of :mod:`app.adapters.vici.models`.

A connection goes back to the pool only when its command ended cleanly (a reply, or
charon's own ``success = no``, after which a streamed command has unregistered its
events); one that saw a socket error, a timeout or a protocol error is closed. An idle
connection that charon closed (it restarted) is noticed before use and replaced; a
read-only or replacing command (``version``, ``list-*``, ``load-*`` ...) that still
fails on a reused connection with a socket error is sent once more on a new one, any
other command never is.

:meth:`ViciGateway.batch` sends several commands on one connection without waiting for
each reply (charon answers one connection's requests strictly in order) and then reads
the replies: one round trip instead of one per command; :meth:`ViciGateway.pipeline`
does the same with the reading left for later. A streamed command (``initiate_command``,
``list_sas_command``) goes out between its event's registration and unregistration in the
same write, and its events come back with its reply. Each command's failure is its own; a
socket error fails the whole batch.

Every failure leaves as a project exception, chained to its cause:

- socket missing, refused, closed or silent -> :class:`~app.domain.errors.GatewayUnreachable`
  naming the socket;
- charon answered ``success = no`` (or does not know the command) ->
  :class:`~app.domain.errors.GatewayRejected` with charon's ``errmsg`` and, for
  ``initiate``/``terminate``, the log lines that say why (``NO_PROPOSAL_CHOSEN`` ...).

A pre-shared key handed to :meth:`ViciGateway.load_shared` is never logged, stored, or
put into an exception message.

Minimum strongSwan versions are noted per method; the lab and the project run 5.9.8.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, NamedTuple, NoReturn, Protocol, TypeVar

import vici
import vici.exception
from vici.protocol import Message, Packet

from app.adapters.sockets import idle_and_open
from app.adapters.vici.models import (
    Algorithms,
    IkeSa,
    Pool,
    Stats,
    VersionInfo,
    decode,
    parse_algorithms,
    parse_ike_sa,
    parse_pools,
    parse_stats,
    parse_version,
)
from app.domain.errors import GatewayError, GatewayRejected, GatewayUnreachable

__all__ = [
    "AsyncViciGateway",
    "Command",
    "Connect",
    "Pipeline",
    "SessionPool",
    "ViciGateway",
    "ViciSession",
    "initiate_command",
    "list_sas_command",
    "sas_of",
    "unix_connect",
]

_log = logging.getLogger(__name__)

#: Log lines of an ``initiate``/``terminate`` that explain a failure.
_REASON = re.compile(
    r"\b(?:[A-Z0-9]+_)*(?:CHOSEN|FAILED|UNACCEPTABLE|REQUIRED|INVALID[A-Z_]*)\b|notify|fail|unable|giving up|"
    r"retransmit|timed? ?out|not (?:found|established)|no (?:matching|acceptable|trusted|shared|config)",
    re.IGNORECASE,
)
#: Message traces, which name every payload and would drown the reason.
_TRACE = re.compile(r"^(?:generating|parsed|sending packet|received packet) ")
_MAX_REASONS = 8
_CMD_UNKNOWN = 2  # vici Packet.CMD_UNKNOWN
#: Commands charon may safely receive twice (read-only, or load-and-replace): only these are
#: sent again, on a new connection, when a reused connection fails with a socket error.
_REPEATABLE = frozenset({
    "version", "stats", "get-algorithms", "get-shared", "get-pools", "list-sas", "list-conns",
    "load-conn", "load-shared", "load-pool",
})
_T = TypeVar("_T")


class ViciSession(Protocol):
    """What the driver needs of a VICI session (``vici.Session`` has it)."""

    def request(self, command: str, message: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
        """Send one command, return its (raw) reply."""
        ...

    def streamed_request(
        self, command: str, event_stream_type: str, message: Mapping[str, Any] | None = None
    ) -> Iterator[Mapping[str, Any]]:
        """Send one command, yield the events it streams, raise if it failed."""
        ...


class Command(NamedTuple):
    """One VICI command for :meth:`ViciGateway.batch` (built by the ``*_command`` functions)."""

    name: str
    message: Mapping[str, Any] | None = None
    #: Values that must never appear in a log line or an exception (a PSK).
    secrets: tuple[str, ...] = ()
    #: A streamed command's event (``control-log``, ``list-sa`` ...): registered just before the
    #: command and unregistered just after it, in the same write. Its decoded reply carries the
    #: events it streamed, decoded, under ``"events"``.
    stream: str | None = None
    #: Seconds charon may take on top of the gateway's timeout before it replies
    #: (``initiate``'s own timeout).
    wait: float = 0.0


def load_conn_command(name: str, conn: Mapping[str, Any]) -> Command:
    """``load-conn``: load or replace connection ``name`` with swanctl.conf-style settings."""
    return Command("load-conn", {name: dict(conn)})


def load_shared_command(id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> Command:
    """``load-shared`` with a unique ``id``; the secret is kept out of every log and exception."""
    data = secret if isinstance(secret, bytes) else secret.encode("utf-8")
    hidden = [data.decode("utf-8", errors="replace")]
    if isinstance(secret, str):
        hidden.append(secret)
    return Command("load-shared", {"id": id, "type": type, "data": data, "owners": list(owners)}, tuple(hidden))


def load_pool_command(name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> Command:
    """``load-pool``: load or replace virtual IP pool ``name`` (a subnet or a range)."""
    pool: dict[str, Any] = {"addrs": addrs}
    for key, values in (attributes or {}).items():
        pool[key] = list(values)
    return Command("load-pool", {name: pool})


def _initiate_message(child: str | None, ike: str | None, timeout_ms: int, loglevel: int) -> dict[str, Any]:
    message: dict[str, Any] = {"timeout": timeout_ms, "loglevel": loglevel, "init-limits": "no"}
    if child is not None:
        message["child"] = child
    if ike is not None:
        message["ike"] = ike
    return message


def initiate_command(child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                     loglevel: int = 1) -> Command:
    """``initiate`` (streamed): see :meth:`ViciGateway.initiate`. In a batch, a failure is a
    :class:`GatewayRejected` with charon's log lines that say why, as ``initiate`` gives."""
    return Command("initiate", _initiate_message(child, ike, timeout_ms, loglevel), stream="control-log",
                   wait=max(timeout_ms, 0) / 1000.0)


def _list_sas_message(ike: str | None, ike_id: int | None) -> dict[str, Any]:
    # Not ``noblock``: an IKE_SA a worker holds would be read half-updated (a CHILD_SA
    # just reported established may be missing); charon waits for it instead.
    message: dict[str, Any] = {}
    if ike is not None:
        message["ike"] = ike
    if ike_id is not None:
        message["ike-id"] = ike_id
    return message


def list_sas_command(ike: str | None = None, ike_id: int | None = None) -> Command:
    """``list-sas`` (streamed): read the IKE_SAs from its reply's ``events`` with :func:`sas_of`."""
    return Command("list-sas", _list_sas_message(ike, ike_id), stream="list-sa")


def sas_of(events: Sequence[Mapping[str, Any]]) -> list[IkeSa]:
    """The IKE_SAs in decoded ``list-sa`` events."""
    return [parse_ike_sa(name, body) for event in events for name, body in event.items() if isinstance(body, Mapping)]


def unload_command(what: str, name: str) -> Command:
    """``unload-conn``/``unload-pool`` (by name) or ``unload-shared`` (by id)."""
    if what not in ("conn", "pool", "shared"):
        raise ValueError(f"nothing to unload called {what!r}")
    return Command(f"unload-{what}", {"id" if what == "shared" else "name": name})


class _StreamFailed(vici.exception.CommandException):  # type: ignore[misc]
    """charon's refusal of a streamed command, with the events it streamed first (log lines)."""

    def __init__(self, message: str, events: list[Mapping[str, Any]]) -> None:
        super().__init__(message)
        self.events = events


def _send(session: ViciSession, commands: Sequence[Command]) -> list[Mapping[str, Any] | Exception] | None:
    """Write ``commands`` in one go (the ``vici`` package's session), a streamed one between the
    registration and the unregistration of its event: None, the replies are read by
    :func:`_receive`. Any other session (a test's) is asked one command at a time: its replies
    (or :class:`vici.exception.CommandException`) at once."""
    transport = getattr(session, "transport", None)
    if transport is None:
        out: list[Mapping[str, Any] | Exception] = []
        for command in commands:
            events: list[Mapping[str, Any]] = []
            try:
                if command.stream is None:
                    out.append(session.request(command.name, command.message))
                else:
                    events.extend(session.streamed_request(command.name, command.stream, command.message))
                    out.append({"events": events})
            except vici.exception.CommandException as exc:
                out.append(_StreamFailed(str(exc), events) if command.stream else exc)
        return out
    packets: list[bytes] = []
    for c in commands:
        request = Packet.request(c.name, None if c.message is None else Message.serialize(c.message))
        if c.stream is None:
            packets.append(request)
        else:
            packets += [Packet.register_event(c.stream), request, Packet.unregister_event(c.stream)]
    transport.socket.sendall(b"".join(len(p).to_bytes(4, "big") + p for p in packets))
    return None


def _confirmed(transport: Any, command: Command) -> None:
    """Read charon's confirmation of a streamed command's event (un)registration."""
    kind = Packet.parse(transport.receive()).response_type
    if kind == Packet.EVENT_UNKNOWN:
        raise vici.exception.EventUnknownException(f"Unknown event type '{command.stream}'")
    if kind != Packet.EVENT_CONFIRM:
        raise vici.exception.SessionException(
            f"Unexpected response type {kind} to the {command.stream} registration of {command.name}, "
            f"expected '{Packet.EVENT_CONFIRM}' (EVENT_CONFIRM)")


def _receive(session: ViciSession, commands: Sequence[Command]) -> list[Mapping[str, Any] | Exception]:
    """The raw replies to ``commands`` sent by :func:`_send` (charon answers in order), each the
    message (a streamed command's with its decoded-later ``events``) or its
    :class:`vici.exception.CommandException`."""
    transport = getattr(session, "transport")  # noqa: B009 - only sessions that have one get here
    replies: list[Mapping[str, Any] | Exception] = []
    for command in commands:
        events: list[Mapping[str, Any]] = []
        if command.stream is not None:
            _confirmed(transport, command)
        timeout = transport.socket.gettimeout()
        while True:
            if command.wait and timeout is not None:
                response = Packet.parse(transport.receive(timeout + command.wait))
            else:
                response = Packet.parse(transport.receive())
            if response.response_type != Packet.EVENT or command.stream is None:
                break
            events.append(Message.deserialize(response.payload))
        if response.response_type != Packet.CMD_RESPONSE:
            raise vici.exception.SessionException(
                f"Unexpected response type {response.response_type} to {command.name}, "
                f"expected '{Packet.CMD_RESPONSE}' (CMD_RESPONSE)")
        reply = Message.deserialize(response.payload)
        if command.stream is not None:
            _confirmed(transport, command)
        if "success" in reply and reply["success"] != b"yes":
            errmsg = reply.get("errmsg", b"")
            why = errmsg.decode("utf-8", errors="replace") if isinstance(errmsg, bytes) else str(errmsg)
            text = f"Command failed: {why}"
            replies.append(_StreamFailed(text, events) if command.stream else vici.exception.CommandException(text))
        else:
            replies.append({**reply, "events": events} if command.stream else reply)
    return replies


def _pipelined(session: ViciSession, commands: Sequence[Command]) -> list[Mapping[str, Any] | Exception]:
    """Every command's raw reply, or its :class:`vici.exception.CommandException`, in order:
    all requests written first, then the replies read."""
    early = _send(session, commands)
    return early if early is not None else _receive(session, commands)


class Pipeline:
    """Commands written now, their replies read later, on one connection (from
    :meth:`ViciGateway.pipeline`): charon works on them while the caller does something else.

    :meth:`send` may be called several times; :meth:`finish` reads every reply not read yet and
    returns all of them in the order sent (a reply, or charon's refusal as
    :class:`GatewayRejected`). Closing returns the connection to the pool only if every reply
    was read; otherwise it is closed, and charon still runs what it received.
    """

    def __init__(self, gateway: ViciGateway) -> None:
        self._gateway = gateway
        self._key = (gateway._connect, gateway.socket_path, gateway.timeout)
        self._held: _Held | None = None
        self._unread: list[Command] = []
        self._replies: list[dict[str, Any] | GatewayRejected] = []
        self._secrets: tuple[str, ...] = ()
        self._broken = False

    def send(self, commands: Sequence[Command]) -> None:
        """Write ``commands`` without waiting for charon.

        Raises:
            GatewayUnreachable: the socket failed (which commands charon got is unknown). A
                reused connection that fails as the first commands go out, all of them
                repeatable, is replaced once.
        """
        if not commands:
            return
        g = self._gateway
        names = ",".join(c.name for c in commands)
        self._secrets += tuple(s for c in commands for s in c.secrets)
        _log.debug("vici %s on %s (pipelined)", names, g.socket_path)
        try:
            if self._held is None:
                pool = g._pool
                held = pool.take(self._key) if pool is not None else None
                if held is not None:
                    try:
                        self._early(_send(held.session, commands), commands)
                        self._held = held
                        return
                    except OSError as exc:
                        held.close()
                        if isinstance(exc, TimeoutError) or not all(c.name in _REPEATABLE for c in commands):
                            raise
                        _log.debug("vici %s on %s: reused session failed (%s), once more on a new one",
                                   names, g.socket_path, type(exc).__name__)
                self._held = _Held(g._connect, g.socket_path, g.timeout)
            self._early(_send(self._held.session, commands), commands)
        except Exception as exc:
            self._broken = True
            g._fail(exc, names, g.timeout, secrets=self._secrets)

    def _early(self, replies: list[Mapping[str, Any] | Exception] | None, commands: Sequence[Command]) -> None:
        if replies is None:
            self._unread.extend(commands)
        else:
            self._replies.extend(self._gateway._decoded(commands, replies, self._secrets))

    def finish(self) -> list[dict[str, Any] | GatewayRejected]:
        """Every reply so far, in the order sent (reading those not read yet).

        Raises:
            GatewayUnreachable: the socket failed before every reply was read.
        """
        if self._unread:
            assert self._held is not None
            unread, self._unread = self._unread, []
            try:
                raw = _receive(self._held.session, unread)
            except Exception as exc:
                self._broken = True
                self._gateway._fail(exc, ",".join(c.name for c in unread), self._gateway.timeout,
                                    secrets=self._secrets)
            self._replies.extend(self._gateway._decoded(unread, raw, self._secrets))
        return list(self._replies)

    def close(self) -> None:
        """Give the connection back (every reply read) or close it."""
        held, self._held = self._held, None
        if held is None:
            return
        if self._broken or self._unread:
            held.close()
        else:
            self._gateway._give(self._key, held)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Opens a session to ``socket_path`` whose reads time out after ``timeout`` seconds,
#: and closes it when the context ends.
Connect = Callable[[str, float], AbstractContextManager[ViciSession]]


@contextmanager
def unix_connect(socket_path: str, timeout: float) -> Iterator[ViciSession]:
    """The production :data:`Connect`: a UNIX stream socket wrapped in ``vici.Session``.

    VICI over TCP has no authentication, so only UNIX sockets are supported.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        session: ViciSession = vici.Session(sock=sock)
        yield session
    finally:
        sock.close()


class _Held:
    """One open session and what closes it (the :data:`Connect` context, kept entered)."""

    __slots__ = ("_stack", "session")

    def __init__(self, connect: Connect, socket_path: str, timeout: float) -> None:
        self._stack = ExitStack()
        self.session: ViciSession = self._stack.enter_context(connect(socket_path, timeout))

    def alive(self) -> bool:
        """False if an idle session's socket has something to read: charon closed it (or sent
        something no one asked for). Sessions without a visible socket count as alive."""
        sock = getattr(getattr(self.session, "transport", None), "socket", None)
        return not isinstance(sock, socket.socket) or idle_and_open(sock)

    def close(self) -> None:
        try:
            self._stack.close()
        except Exception as exc:  # closing must never hide the error that got us here
            _log.debug("closing a VICI session: %s", type(exc).__name__)


class SessionPool:
    """Idle VICI sessions for reuse: at most ``max_idle`` per key (connect seam, socket, timeout)
    and ``max_total`` in all.

    A session is held by one caller at a time: :meth:`take` removes it from the pool and
    :meth:`give` puts it back (or closes it when the pool is full). Thread-safe; a forked
    child starts with an empty pool (the parent's sockets are not its to use).
    """

    def __init__(self, max_idle: int = 4, max_total: int = 32) -> None:
        self.max_idle = max_idle
        self.max_total = max_total
        self._total = 0
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[_Held]] = {}

    def take(self, key: Hashable) -> _Held | None:
        """An idle session still connected, or None; dead ones met on the way are closed."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                held = idle.pop() if idle else None
                self._total -= held is not None
            if held is None or held.alive():
                return held
            _log.debug("dropping a VICI session closed by the other end")
            held.close()

    def give(self, key: Hashable, held: _Held) -> None:
        """Return a session after a command that ended cleanly."""
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle and self._total < self.max_total:
                idle.append(held)
                self._total += 1
                return
        held.close()

    def idle(self, key: Hashable) -> int:
        """How many sessions are idle under ``key``."""
        with self._lock:
            return len(self._idle.get(key, ()))

    def close(self) -> None:
        """Close every idle session (at process exit, or in tests)."""
        with self._lock:
            helds = [h for idle in self._idle.values() for h in idle]
            self._idle.clear()
            self._total = 0
        for held in helds:
            held.close()

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._idle = {}
        self._total = 0


#: The pool every :class:`ViciGateway` shares (gateways are cheap and made per use).
POOL = SessionPool()
atexit.register(POOL.close)
os.register_at_fork(after_in_child=POOL._forget)


def _log_lines(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """charon's log lines in decoded ``control-log`` events."""
    return [str(e["msg"]) for e in events if e.get("msg")]


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<secret>")
    return text


def _reasons(log: Sequence[str]) -> list[str]:
    picked = [line for line in log if _REASON.search(line) and not _TRACE.match(line)] or list(log[-3:])
    out: list[str] = []
    for line in picked:
        if line not in out:
            out.append(line)
    return out[-_MAX_REASONS:]


def _unreachable_reason(exc: OSError, timeout: float) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket (is charon running?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (charon is not listening)"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc) or type(exc).__name__


class ViciGateway:
    """A charon reached through its VICI UNIX socket (synchronous, thread-safe).

    Args:
        socket_path: the VICI socket, e.g. ``/run/charon.vici``.
        timeout: seconds to wait for connecting and for each reply (``initiate`` and
            ``terminate`` wait their own ``timeout_ms`` on top).
        connect: the I/O seam; opens a session. Defaults to :func:`unix_connect`.
        pool: where idle sessions wait for reuse (default: the process-wide :data:`POOL`);
            None opens a new session for every operation.
    """

    def __init__(self, socket_path: str, timeout: float = 10.0, connect: Connect = unix_connect,
                 pool: SessionPool | None = POOL) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._connect = connect
        self._pool = pool

    def __repr__(self) -> str:
        return f"ViciGateway(socket_path={self.socket_path!r}, timeout={self.timeout!r})"

    # -- plumbing -------------------------------------------------------------

    def _fail(
        self,
        exc: Exception,
        command: str,
        timeout: float,
        *,
        log: Sequence[str] = (),
        secrets: Sequence[str] = (),
    ) -> NoReturn:
        """Raise the project exception for ``exc``, chained unless the cause names a secret."""
        if isinstance(exc, GatewayError):
            raise exc
        error: GatewayError
        if isinstance(exc, vici.exception.CommandException):
            message = str(exc).removeprefix("Command failed: ").strip() or "command failed"
            reasons = _reasons(log)
            text = f"{command}: {message}"
            if reasons:
                text += " [charon log: " + " | ".join(reasons) + "]"
            error = GatewayRejected(_scrub(text, secrets))
        elif isinstance(exc, vici.exception.EventUnknownException):
            error = GatewayRejected(f"{command}: charon does not know the event stream it needs ({exc})")
        elif isinstance(exc, vici.exception.SessionException) and f"type {_CMD_UNKNOWN}," in str(exc):
            error = GatewayRejected(f"{command}: charon does not know this VICI command (too old a strongSwan?)")
        elif isinstance(exc, vici.exception.SessionException | vici.exception.DeserializationException):
            error = GatewayUnreachable(self.socket_path, _scrub(f"VICI protocol error in {command}: {exc}", secrets))
        elif isinstance(exc, OSError):
            error = GatewayUnreachable(self.socket_path, _unreachable_reason(exc, timeout))
        else:
            error = GatewayUnreachable(
                self.socket_path, _scrub(f"unexpected {type(exc).__name__} in {command}: {exc}", secrets)
            )
        _log.debug("vici %s on %s failed: %s", command, self.socket_path, error.message)
        if any(s and s in str(exc) for s in secrets):
            raise error from None
        raise error from exc

    def _run(self, command: str, wait: float, call: Callable[[ViciSession], _T]) -> _T:
        """``call`` on a pooled session (or a new one), which goes back to the pool only if the
        command ended cleanly. A repeatable command that hit a socket error on a reused session
        is run once more on a new one."""
        key = (self._connect, self.socket_path, wait)
        held = self._pool.take(key) if self._pool is not None else None
        if held is None:
            return self._attempt(key, _Held(self._connect, self.socket_path, wait), call)
        try:
            return self._attempt(key, held, call)
        except OSError as exc:
            if command not in _REPEATABLE or isinstance(exc, TimeoutError):
                raise
            _log.debug("vici %s on %s: reused session failed (%s), once more on a new one",
                       command, self.socket_path, type(exc).__name__)
            return self._attempt(key, _Held(self._connect, self.socket_path, wait), call)

    def _attempt(self, key: Hashable, held: _Held, call: Callable[[ViciSession], _T]) -> _T:
        """``call`` on ``held``; the session goes back to the pool after a reply or charon's own
        ``success = no`` (it is in step, events unregistered), and is closed after anything else."""
        try:
            result = call(held.session)
        except vici.exception.CommandException:
            self._give(key, held)
            raise
        except BaseException:
            held.close()
            raise
        self._give(key, held)
        return result

    def _give(self, key: Hashable, held: _Held) -> None:
        if self._pool is None:
            held.close()
        else:
            self._pool.give(key, held)

    def _request(
        self,
        command: str,
        message: Mapping[str, Any] | None = None,
        secrets: Sequence[str] = (),
    ) -> dict[str, Any]:
        _log.debug("vici %s on %s", command, self.socket_path)
        try:
            reply = self._run(command, self.timeout, lambda session: session.request(command, message))
        except Exception as exc:
            self._fail(exc, command, self.timeout, secrets=secrets)
        decoded: dict[str, Any] = decode(reply)
        return decoded

    def _one(self, command: Command) -> dict[str, Any]:
        """One unstreamed :class:`Command` on its own."""
        return self._request(command.name, command.message, command.secrets)

    def batch(self, commands: Sequence[Command]) -> list[dict[str, Any] | GatewayRejected]:
        """Run ``commands`` in order on one connection, pipelined (see the module's docstring).

        Returns:
            per command, its decoded reply or the :class:`GatewayRejected` charon's refusal
            makes of it (the others still ran).

        Raises:
            GatewayUnreachable: the socket failed; which commands took effect is unknown (a
                batch of only repeatable commands was sent once more on a new connection if a
                reused one failed).
        """
        if not commands:
            return []
        names = ",".join(c.name for c in commands)
        secrets = tuple(s for c in commands for s in c.secrets)
        _log.debug("vici %s on %s", names, self.socket_path)
        repeatable = all(c.name in _REPEATABLE for c in commands)
        try:
            replies = self._run(commands[0].name if repeatable else names, self.timeout,
                                lambda session: _pipelined(session, commands))
        except Exception as exc:
            self._fail(exc, names, self.timeout, secrets=secrets)
        return self._decoded(commands, replies)

    def pipeline(self) -> Pipeline:
        """A :class:`Pipeline` on one connection of this charon's (use it as a context manager)."""
        return Pipeline(self)

    def _decoded(self, commands: Sequence[Command], replies: Sequence[Mapping[str, Any] | Exception],
                 secrets: Sequence[str] = ()) -> list[dict[str, Any] | GatewayRejected]:
        """Replies decoded, refusals as :class:`GatewayRejected` (scrubbed of every secret sent
        with them, not just the command's own: one connection's commands share a fate)."""
        hidden = (*secrets, *(s for c in commands for s in c.secrets))
        out: list[dict[str, Any] | GatewayRejected] = []
        for command, reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                streamed = decode(reply.events) if isinstance(reply, _StreamFailed) else []
                log = _log_lines(streamed) if command.stream == "control-log" else []
                try:
                    self._fail(reply, command.name, self.timeout, log=log, secrets=hidden)
                except GatewayRejected as rejected:
                    out.append(rejected)
            else:
                out.append(decode(reply))
        return out

    def _streamed(
        self,
        command: str,
        event: str,
        message: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Run a streamed command, consuming every event; returns the decoded events."""
        wait = self.timeout if timeout is None else timeout
        _log.debug("vici %s on %s", command, self.socket_path)
        events: list[dict[str, Any]] = []

        def stream(session: ViciSession) -> None:
            events.clear()  # a repeated list-* starts over
            for raw in session.streamed_request(command, event, message):
                events.append(decode(raw))

        try:
            self._run(command, wait, stream)
        except Exception as exc:
            log = _log_lines(events) if event == "control-log" else []
            self._fail(exc, command, wait, log=log)
        return events

    def _control(self, command: str, message: Mapping[str, Any], timeout_ms: int) -> list[str]:
        wait = self.timeout + max(timeout_ms, 0) / 1000.0
        events = self._streamed(command, "control-log", message, timeout=wait)
        return _log_lines(events)

    # -- information ----------------------------------------------------------

    def version(self) -> VersionInfo:
        """Daemon and system version (VICI ``version``, strongSwan >= 5.2.0)."""
        return parse_version(self._request("version"))

    def stats(self) -> Stats:
        """Load, plugins and IPsec back end (VICI ``stats``, strongSwan >= 5.2.0)."""
        return parse_stats(self._request("stats"))

    def get_algorithms(self) -> Algorithms:
        """Algorithms the loaded plugins provide (VICI ``get-algorithms``, strongSwan >= 5.4.0).

        The key-exchange section (``dh`` in 5.9, ``ke`` in 6.0) is returned as ``ke``.
        """
        return parse_algorithms(self._request("get-algorithms"))

    def list_sas(self, *, ike: str | None = None, ike_id: int | None = None) -> list[IkeSa]:
        """The IKE_SAs and their CHILD_SAs (VICI ``list-sas``, streamed, strongSwan >= 5.2.0).

        Args:
            ike: only IKE_SAs of this connection.
            ike_id: only the IKE_SA with this unique id.
        """
        return sas_of(self._streamed("list-sas", "list-sa", _list_sas_message(ike, ike_id)))

    def list_conns(self) -> list[str]:
        """Names of the loaded connections (VICI ``list-conns``, streamed, strongSwan >= 5.2.0)."""
        names: list[str] = []
        for event in self._streamed("list-conns", "list-conn"):
            names.extend(name for name, body in event.items() if isinstance(body, Mapping))
        return names

    def get_shared(self) -> list[str]:
        """Ids of the shared secrets loaded with an id (VICI ``get-shared``, strongSwan >= 5.5.2)."""
        reply = self._request("get-shared")
        keys = reply.get("keys", [])
        return [str(k) for k in keys] if isinstance(keys, list) else []

    def get_pools(self, leases: bool = True, name: str | None = None) -> list[Pool]:
        """Virtual IP pools (VICI ``get-pools``, strongSwan >= 5.2.0; ``leases`` >= 5.4.0, ``name`` >= 5.6.3)."""
        message: dict[str, Any] = {"leases": "yes" if leases else "no"}
        if name is not None:
            message["name"] = name
        return parse_pools(self._request("get-pools", message))

    # -- configuration ---------------------------------------------------------

    def load_conn(self, name: str, conn: Mapping[str, Any]) -> None:
        """Load or replace connection ``name`` (VICI ``load-conn``, strongSwan >= 5.2.0).

        Args:
            name: the connection name.
            conn: its settings as in swanctl.conf (``local_addrs``, ``proposals``,
                ``local``, ``remote``, ``children`` ...).
        """
        self._one(load_conn_command(name, conn))

    def unload_conn(self, name: str) -> None:
        """Unload connection ``name`` (VICI ``unload-conn``, strongSwan >= 5.2.0)."""
        self._one(unload_command("conn", name))

    def load_shared(self, id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> None:
        """Load a shared secret under a unique id (VICI ``load-shared`` with ``id``, strongSwan >= 5.5.2).

        The secret is neither logged nor kept, and never appears in an exception.

        Args:
            id: unique id of the secret, for :meth:`unload_shared` and :meth:`get_shared`.
            secret: the secret itself.
            owners: the identities that share it.
            type: ``IKE``, ``EAP``, ``XAUTH``, ``NTLM`` or ``PPK``.
        """
        self._one(load_shared_command(id, secret, owners, type))

    def unload_shared(self, id: str) -> None:
        """Unload the shared secret with this id (VICI ``unload-shared``, strongSwan >= 5.5.2)."""
        self._one(unload_command("shared", id))

    def load_pool(self, name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> None:
        """Load or replace a virtual IP pool (VICI ``load-pool``, strongSwan >= 5.2.0).

        Args:
            name: the pool name.
            addrs: a subnet (``10.3.0.0/28``) or a range (``10.3.0.1-10.3.0.9``).
            attributes: extra attributes such as ``dns``.
        """
        self._one(load_pool_command(name, addrs, attributes))

    def unload_pool(self, name: str) -> None:
        """Unload a virtual IP pool (VICI ``unload-pool``, strongSwan >= 5.2.0)."""
        self._one(unload_command("pool", name))

    # -- control ----------------------------------------------------------------

    def initiate(self, child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                 loglevel: int = 1) -> list[str]:
        """Bring up a CHILD_SA (and its IKE_SA) and wait (VICI ``initiate``, streamed, strongSwan >= 5.2.0).

        Args:
            child: the CHILD_SA config to initiate.
            ike: the connection it belongs to (needed if the child name is ambiguous).
            timeout_ms: how long charon waits for the result; 0 waits without limit.
            loglevel: verbosity of the ``control-log`` lines collected.

        Returns:
            charon's log lines for the operation.

        Raises:
            GatewayRejected: charon failed; the message carries its reason from the log.
            GatewayUnreachable: the socket cannot be reached.
        """
        return self._control("initiate", _initiate_message(child, ike, timeout_ms, loglevel), timeout_ms)

    def terminate(self, *, ike: str | None = None, child: str | None = None, ike_id: int | None = None,
                  child_id: int | None = None, timeout_ms: int = 5_000, force: bool = False,
                  loglevel: int = 1) -> list[str]:
        """Close IKE_SAs or CHILD_SAs and wait (VICI ``terminate``, streamed, strongSwan >= 5.2.0).

        ``force`` needs strongSwan >= 5.5.0. Name at least one of the selectors.

        Returns:
            charon's log lines for the operation.

        Raises:
            GatewayRejected: nothing matched, or charon failed.
            GatewayUnreachable: the socket cannot be reached.
        """
        message: dict[str, Any] = {"timeout": timeout_ms, "loglevel": loglevel}
        for key, value in (("ike", ike), ("child", child), ("ike-id", ike_id), ("child-id", child_id)):
            if value is not None:
                message[key] = value
        if len(message) == 2:
            raise ValueError("terminate needs ike, child, ike_id or child_id")
        if force:
            message["force"] = "yes"
        return self._control("terminate", message, timeout_ms)


class AsyncViciGateway:
    """The same operations as :class:`ViciGateway`, each run in a worker thread.

    Args:
        gateway: the synchronous gateway to run off the event loop.
    """

    def __init__(self, gateway: ViciGateway) -> None:
        self.sync = gateway

    @classmethod
    def for_socket(cls, socket_path: str, timeout: float = 10.0, connect: Connect = unix_connect) -> AsyncViciGateway:
        """An async gateway over a new :class:`ViciGateway`."""
        return cls(ViciGateway(socket_path, timeout, connect))

    @property
    def socket_path(self) -> str:
        """The VICI socket."""
        return self.sync.socket_path

    def __repr__(self) -> str:
        return f"AsyncViciGateway({self.sync!r})"

    async def version(self) -> VersionInfo:
        """See :meth:`ViciGateway.version`."""
        return await asyncio.to_thread(self.sync.version)

    async def stats(self) -> Stats:
        """See :meth:`ViciGateway.stats`."""
        return await asyncio.to_thread(self.sync.stats)

    async def get_algorithms(self) -> Algorithms:
        """See :meth:`ViciGateway.get_algorithms`."""
        return await asyncio.to_thread(self.sync.get_algorithms)

    async def list_sas(self, *, ike: str | None = None, ike_id: int | None = None) -> list[IkeSa]:
        """See :meth:`ViciGateway.list_sas`."""
        return await asyncio.to_thread(self.sync.list_sas, ike=ike, ike_id=ike_id)

    async def list_conns(self) -> list[str]:
        """See :meth:`ViciGateway.list_conns`."""
        return await asyncio.to_thread(self.sync.list_conns)

    async def get_shared(self) -> list[str]:
        """See :meth:`ViciGateway.get_shared`."""
        return await asyncio.to_thread(self.sync.get_shared)

    async def get_pools(self, leases: bool = True, name: str | None = None) -> list[Pool]:
        """See :meth:`ViciGateway.get_pools`."""
        return await asyncio.to_thread(self.sync.get_pools, leases, name)

    async def load_conn(self, name: str, conn: Mapping[str, Any]) -> None:
        """See :meth:`ViciGateway.load_conn`."""
        await asyncio.to_thread(self.sync.load_conn, name, conn)

    async def unload_conn(self, name: str) -> None:
        """See :meth:`ViciGateway.unload_conn`."""
        await asyncio.to_thread(self.sync.unload_conn, name)

    async def load_shared(self, id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> None:
        """See :meth:`ViciGateway.load_shared`."""
        await asyncio.to_thread(self.sync.load_shared, id, secret, owners, type)

    async def unload_shared(self, id: str) -> None:
        """See :meth:`ViciGateway.unload_shared`."""
        await asyncio.to_thread(self.sync.unload_shared, id)

    async def load_pool(self, name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> None:
        """See :meth:`ViciGateway.load_pool`."""
        await asyncio.to_thread(self.sync.load_pool, name, addrs, attributes)

    async def unload_pool(self, name: str) -> None:
        """See :meth:`ViciGateway.unload_pool`."""
        await asyncio.to_thread(self.sync.unload_pool, name)

    async def initiate(self, child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                       loglevel: int = 1) -> list[str]:
        """See :meth:`ViciGateway.initiate`."""
        return await asyncio.to_thread(self.sync.initiate, child, ike, timeout_ms, loglevel)

    async def terminate(self, *, ike: str | None = None, child: str | None = None, ike_id: int | None = None,
                        child_id: int | None = None, timeout_ms: int = 5_000, force: bool = False,
                        loglevel: int = 1) -> list[str]:
        """See :meth:`ViciGateway.terminate`."""
        return await asyncio.to_thread(
            lambda: self.sync.terminate(
                ike=ike, child=child, ike_id=ike_id, child_id=child_id,
                timeout_ms=timeout_ms, force=force, loglevel=loglevel,
            )
        )
