"""Several VICI commands on one connection without waiting for each reply: charon answers one
connection's requests strictly in order, so they are written in one go and the replies read
afterwards (:class:`Pipeline` leaves the reading for later). A streamed command goes out
between its event's registration and unregistration, in the same write."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import vici
import vici.exception
from vici.protocol import Message, Packet

from app.adapters.vici.commands import _REPEATABLE, Command
from app.adapters.vici.session import ViciSession, _Held
from app.adapters.vici.slots import CONTROL_COMMANDS
from app.domain.errors import GatewayRejected

if TYPE_CHECKING:
    from app.adapters.vici.gateway import ViciGateway

__all__ = ["Pipeline"]

_log = logging.getLogger(__name__)


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
        self._release: Callable[[], None] | None = None  # a control slot, held until close

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
        if self._release is None and any(c.name in CONTROL_COMMANDS for c in commands):
            self._release = g._control_slot(names, g.timeout)
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
        """Give the connection back (every reply read) or close it; give back a control slot."""
        release, self._release = self._release, None
        if release is not None:
            release()
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
