"""Several VICI commands on one connection without waiting for each reply: charon answers one
connection's requests strictly in order, so they are written in one go and the replies read
afterwards (:class:`app.adapters.vici.gateway.Pipeline` leaves the reading for later). A
streamed command goes out between its event's registration and unregistration, in the same
write. The wire half only: which connection, and what the replies mean, is the gateway's."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import vici
import vici.exception
from vici.protocol import Message, Packet

from app.adapters.vici import wire
from app.adapters.vici.commands import Command
from app.adapters.vici.models import Decoded
from app.adapters.vici.session import ViciSession

__all__ = ["StreamFailed", "pipelined", "receive_replies", "send_commands"]

_log = logging.getLogger(__name__)


class StreamFailed(vici.exception.CommandException):  # type: ignore[misc]
    """charon's refusal of a streamed command, with the events it streamed first (log lines)."""

    def __init__(self, message: str, events: list[Mapping[str, Any]]) -> None:
        super().__init__(message)
        self.events = events


def send_commands(session: ViciSession, commands: Sequence[Command], *, wire: bool = True
                  ) -> list[Mapping[str, Any] | Exception] | None:
    """Write ``commands`` in one go (the ``vici`` package's session), a streamed one between the
    registration and the unregistration of its event: None, the replies are read by
    :func:`receive_replies`. Any other session (a test's), or any session when ``wire`` is false
    (QOSS_FAST_PATHS=false), is asked one command at a time through its public ``request``: its
    replies (or :class:`vici.exception.CommandException`) at once."""
    transport = getattr(session, "transport", None) if wire else None
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
                out.append(StreamFailed(str(exc), events) if command.stream else exc)
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


def receive_replies(session: ViciSession, commands: Sequence[Command]) -> list[Mapping[str, Any] | Exception]:
    """The replies to ``commands`` sent by :func:`send_commands` (charon answers in order), each
    the message (a streamed command's with its ``events``) or its
    :class:`vici.exception.CommandException`: read off the session's socket in large reads and
    decoded in one pass (:mod:`app.adapters.vici.wire`), already ``str`` (:class:`Decoded`)."""
    sock = getattr(session, "transport").socket  # noqa: B009 - only sessions that have one get here
    reader = wire.PacketReader(sock)
    timeout = sock.gettimeout()
    replies: list[Mapping[str, Any] | Exception] = []
    for command in commands:
        events: list[Mapping[str, Any]] = []
        wait = timeout + command.wait if command.wait and timeout is not None else timeout
        if wait != timeout:
            sock.settimeout(wait)
        try:
            if command.stream is not None:
                _confirmed(_next(reader, command), command)
            while True:
                kind, _, payload = _next(reader, command)
                if kind != wire.EVENT or command.stream is None:
                    break
                events.append(Decoded(wire.read_message(payload)))
            if kind != wire.CMD_RESPONSE:
                raise vici.exception.SessionException(
                    f"Unexpected response type {kind} to {command.name}, expected '{wire.CMD_RESPONSE}' (CMD_RESPONSE)")
            reply = Decoded(wire.read_message(payload))
            if command.stream is not None:
                _confirmed(_next(reader, command), command)
        finally:
            if wait != timeout:
                sock.settimeout(timeout)
        if reply.get("success", "yes") != "yes":
            text = f"Command failed: {reply.get('errmsg', '')}"
            replies.append(StreamFailed(text, events) if command.stream else vici.exception.CommandException(text))
        else:
            replies.append(Decoded({**reply, "events": events}) if command.stream else reply)
    if reader.buffered:  # charon sent more than was asked: the connection is out of step
        raise vici.exception.SessionException(f"{reader.buffered} bytes after the replies to {len(commands)} commands")
    return replies


def _next(reader: wire.PacketReader, command: Command) -> tuple[int, str | None, bytes]:
    found = reader.next()
    if found is None:
        raise TimeoutError(f"charon did not answer {command.name} in time")
    return found


def _confirmed(packet: tuple[int, str | None, bytes], command: Command) -> None:
    """charon's confirmation of a streamed command's event (un)registration."""
    kind = packet[0]
    if kind == wire.EVENT_UNKNOWN:
        raise vici.exception.EventUnknownException(f"Unknown event type '{command.stream}'")
    if kind != wire.EVENT_CONFIRM:
        raise vici.exception.SessionException(
            f"Unexpected response type {kind} to the {command.stream} registration of {command.name}, "
            f"expected '{wire.EVENT_CONFIRM}' (EVENT_CONFIRM)")


def pipelined(session: ViciSession, commands: Sequence[Command], *, wire: bool = True
              ) -> list[Mapping[str, Any] | Exception]:
    """Every command's raw reply, or its :class:`vici.exception.CommandException`, in order:
    all requests written first, then the replies read."""
    early = send_commands(session, commands, wire=wire)
    return early if early is not None else receive_replies(session, commands)


#: Opens a session to ``socket_path`` whose reads time out after ``timeout`` seconds,
#: and closes it when the context ends.
