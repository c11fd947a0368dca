"""What app/adapters/vici/pipeline.py relies on in the ``vici`` package below its public
``Session`` (the session's transport, its socket and framing, ``Packet``'s builders), checked
against the pinned version; and the pipelined path against one request at a time through
``Session`` alone (QOSS_FAST_PATHS=false) on the same charon: an upgrade that changes any of it
fails here, naming vici and its version."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import vici
from vici.protocol import Message, Packet, Transport

from app.adapters.vici.commands import list_sas_command, load_conn_command, load_shared_command, unload_command
from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.session import unix_connect
from app.domain.charon_port import ListSas, LoadConn, LoadShared, Unload
from app.domain.errors import GatewayRejected, GatewayUnreachable
from tests.fakes.fake_charon import FakeCharon, ike_sa_message
from tests.fixtures.library_pins import assert_pinned

VICI = assert_pinned("vici", "app/adapters/vici/pipeline.py")


def _shape(ok: bool, what: str) -> None:
    assert ok, (f"vici {VICI}: {what} changed; app/adapters/vici/pipeline.py relies on it "
                "(QOSS_FAST_PATHS=false avoids it)")


def test_the_session_keeps_a_transport_with_its_socket_and_framed_reads(fake: FakeCharon) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(fake.socket_path)
    try:
        session = vici.Session(sock)
        transport = getattr(session, "transport", None)
        _shape(isinstance(transport, Transport), "Session.transport")
        _shape(getattr(transport, "socket", None) is sock, "Transport.socket")
        _shape(callable(getattr(transport, "receive", None)), "Transport.receive")
        request = Packet.request("version", None)
        transport.socket.sendall(len(request).to_bytes(4, "big") + request)
        reply = Packet.parse(transport.receive())
        _shape(reply.response_type == Packet.CMD_RESPONSE, "Packet.parse / CMD_RESPONSE")
        message = Message.deserialize(reply.payload)
        _shape(message.get("daemon", message.get(b"daemon")) in ("charon", b"charon"), "Message.deserialize")
    finally:
        sock.close()


def test_the_packet_builders_and_kinds_are_there() -> None:
    for name in ("request", "register_event", "unregister_event", "parse"):
        _shape(callable(getattr(Packet, name, None)), f"Packet.{name}")
    for kind in ("CMD_RESPONSE", "CMD_UNKNOWN", "EVENT_CONFIRM", "EVENT_UNKNOWN", "EVENT"):
        _shape(isinstance(getattr(Packet, kind, None), int), f"Packet.{kind}")
    _shape(callable(getattr(Message, "serialize", None)), "Message.serialize")


def _batch(fake: FakeCharon, pipelining: bool) -> list[Any]:
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pool=None, pipelining=pipelining)
    fake.sas["c"] = ike_sa_message()
    replies = gateway.batch([
        LoadShared("c", b"not-a-real-psk-0123456789abcdef", ("a", "b")), LoadConn("c", {"children": {"c": {}}}),
        ListSas(ike="c"), Unload("conn", "nope"), Unload("conn", "c"), Unload("shared", "c")])
    with gateway.pipeline() as charon:
        charon.send([load_conn_command("d", {"children": {"d": {}}}), list_sas_command()])
        charon.send([unload_command("conn", "d"), load_shared_command("e", "x" * 32, ["a"])])
        replies += charon.finish()
    gateway.batch([Unload("shared", "e")])
    return replies


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-at-a-time"])
def test_both_paths_give_the_same_replies(fake: FakeCharon, pipelining: bool) -> None:
    replies = _batch(fake, pipelining)
    shared, conn, [sa], refused, unloaded, unshared = replies[:6]
    assert (shared, conn, unloaded, unshared) == ({"success": "yes"},) * 4
    assert sa.name == "c"
    assert isinstance(refused, GatewayRejected)
    assert "unloading connection 'nope' failed" in refused.message
    loaded, listed, unload_d, shared_e = replies[6:]
    assert (loaded, unload_d, shared_e) == ({"success": "yes"},) * 3
    assert [name for event in listed["events"] for name in event] == ["c"]
    assert (fake.conns, fake.shared) == ({}, {})


class _SessionOnly:
    """A ``vici.Session`` whose transport may not be reached past it."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        if name == "transport":
            raise AssertionError("the transport was reached past vici.Session")
        return getattr(self._session, name)


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelined", "one-at-a-time"])
def test_only_the_pipelined_path_reaches_past_the_session(fake: FakeCharon, pipelining: bool) -> None:
    @contextmanager
    def guarded(path: str, timeout: float) -> Iterator[Any]:
        with unix_connect(path, timeout) as session:
            yield _SessionOnly(session)

    gateway = ViciGateway(fake.socket_path, timeout=2.0, connect=guarded, pool=None, pipelining=pipelining)
    if pipelining:
        with pytest.raises(GatewayUnreachable, match="reached past"):
            gateway.batch([ListSas(), ListSas()])
    else:
        assert gateway.batch([ListSas(), ListSas()]) == [[], []]
