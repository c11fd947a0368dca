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

from app.adapters.vici.commands import Command
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


def _confirmed(transport: Any, command: Command) -> None:
    """Read charon's confirmation of a streamed command's event (un)registration."""
    kind = Packet.parse(transport.receive()).response_type
    if kind == Packet.EVENT_UNKNOWN:
        raise vici.exception.EventUnknownException(f"Unknown event type '{command.stream}'")
    if kind != Packet.EVENT_CONFIRM:
        raise vici.exception.SessionException(
            f"Unexpected response type {kind} to the {command.stream} registration of {command.name}, "
            f"expected '{Packet.EVENT_CONFIRM}' (EVENT_CONFIRM)")


def receive_replies(session: ViciSession, commands: Sequence[Command]) -> list[Mapping[str, Any] | Exception]:
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
            replies.append(StreamFailed(text, events) if command.stream else vici.exception.CommandException(text))
        else:
            replies.append({**reply, "events": events} if command.stream else reply)
    return replies


def pipelined(session: ViciSession, commands: Sequence[Command], *, wire: bool = True
              ) -> list[Mapping[str, Any] | Exception]:
    """Every command's raw reply, or its :class:`vici.exception.CommandException`, in order:
    all requests written first, then the replies read."""
    early = send_commands(session, commands, wire=wire)
    return early if early is not None else receive_replies(session, commands)


#: Opens a session to ``socket_path`` whose reads time out after ``timeout`` seconds,
#: and closes it when the context ends.
