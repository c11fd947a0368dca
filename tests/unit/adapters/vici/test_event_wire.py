"""Reading charon's answers off the socket (app/adapters/vici/wire.py): the decoder gives
what the ``vici`` package's decoder and ``models.decode`` give on the same bytes, refuses
malformed messages with the package's exception (never another one), the listener delivers
the same events with it as through ``Session.listen``, and control calls give the same lines
and errors as through ``Session.streamed_request`` (both: QOSS_FAST_PATHS=false)."""

from __future__ import annotations

import contextlib
import queue
import random
from typing import Any

import pytest
from vici.exception import DeserializationException
from vici.protocol import FiniteStream, Message

from app.adapters.vici import EventKind, EventListener, SaEvent, ViciGateway
from app.adapters.vici.models import decode
from app.adapters.vici.wire import read_message
from app.domain.errors import GatewayRejected
from tests.fakes import FakeCharon, child_sa_message, ike_sa_message
from tests.fakes.fake_charon import encode_message


def _messages() -> list[dict[str, Any]]:
    child = child_sa_message(name="t", uniqueid=4, encr_alg="AES_GCM_16", integ_alg=None)
    return [
        {"up": "yes", "qoss-1": ike_sa_message(uniqueid=9, children={"qoss-1-4": child})},
        {"qoss-2": {"old": ike_sa_message(uniqueid=1), "new": ike_sa_message(uniqueid=2)}},
        {"empty-list": [], "empty-section": {}, "value": "", "list": ["a", "b", ""],
         "deep": {"a": {"b": {"c": {"d": ["x"]}}}}},
        {"bytes": b"\x00\xff\xfe not utf-8 \xc3", "\xe4\xb8\xad": "name in UTF-8", "long": "v" * 4000},
        {},
    ]


@pytest.mark.parametrize("message", _messages(), ids=["updown", "rekey", "shapes", "bytes", "empty"])
def test_read_message_gives_what_the_package_and_decode_give(message: dict[str, Any]) -> None:
    raw = encode_message(message)
    assert read_message(raw) == decode(Message.deserialize(FiniteStream(raw)))


def test_a_cut_or_damaged_message_is_refused_with_the_packages_exception() -> None:
    raw = encode_message(_messages()[0])
    whole = read_message(raw)
    refused = 0
    for cut in range(len(raw)):
        try:
            got = read_message(raw[:cut])
        except DeserializationException:
            refused += 1
        else:  # a cut between two top-level elements is a shorter, well-formed message
            assert got.items() <= whole.items()
    assert refused > len(raw) // 2
    rng = random.Random(7)
    for _ in range(3000):
        damaged = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        with contextlib.suppress(DeserializationException):  # anything else fails the test
            read_message(bytes(damaged))
    for _ in range(3000):
        with contextlib.suppress(DeserializationException):
            read_message(rng.randbytes(rng.randint(1, 64)))


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "vici-listen"])
def test_the_listener_delivers_the_same_events_either_way(fake: FakeCharon, wire: bool) -> None:
    got: queue.Queue[SaEvent] = queue.Queue()
    child = child_sa_message(name="t", uniqueid=4, encr_alg="AES_GCM_16", integ_alg=None)
    with EventListener(fake.socket_path, got.put, poll_interval=0.05, wire=wire):
        for kind in EventKind:
            assert fake.listeners(kind.value) == 1
        fake.emit("ike-updown", {"up": "yes", "t": ike_sa_message(uniqueid=9)})
        fake.emit("child-updown", {"t": ike_sa_message(uniqueid=9, children={"t-4": child})})
        fake.emit("ike-rekey", {"t": {"old": ike_sa_message(uniqueid=1), "new": ike_sa_message(uniqueid=2)}})
        events = [got.get(timeout=2) for _ in range(3)]
    assert fake.listeners("ike-updown") == 0  # unregistered on stop
    assert [(e.kind, e.ike_name, e.up) for e in events] == [
        (EventKind.IKE_UPDOWN, "t", True), (EventKind.CHILD_UPDOWN, "t", False), (EventKind.IKE_REKEY, "t", None)]
    assert [e.ike_sa.uniqueid if e.ike_sa else None for e in events] == [9, 9, 2]
    assert [(c.name, c.uniqueid, c.encr_alg) for c in events[1].children] == [("t", 4, "AES_GCM_16")]
    assert events[2].old_ike_sa is not None
    assert events[2].old_ike_sa.uniqueid == 1


@pytest.mark.parametrize("pipelining", [True, False], ids=["wire", "vici-session"])
def test_control_calls_give_the_same_lines_and_errors_either_way(fake: FakeCharon, pipelining: bool) -> None:
    """initiate and terminate pipelined and read off the socket (QOSS_FAST_PATHS on), or through
    ``Session.streamed_request`` (off): the same log lines, the same refusal with its reason,
    and the connection still in step after it."""
    gateway = ViciGateway(fake.socket_path, timeout=2.0, pipelining=pipelining)
    gateway.load_conn("c", {"children": {"c": {}}})
    assert gateway.initiate(child="c", ike="c", timeout_ms=2000)[-1] == "CHILD_SA c{1} established"
    fake.sas["x"] = ike_sa_message()
    assert gateway.terminate(ike="x", force=True) == ["IKE_SA deleted"]
    fake.fail("initiate", "establishing CHILD_SA 'c' failed", log=[
        "received NO_PROPOSAL_CHOSEN notify, no CHILD_SA built", "failed to establish CHILD_SA, keeping IKE_SA"])
    with pytest.raises(GatewayRejected) as info:
        gateway.initiate(child="c", timeout_ms=1000)
    assert str(info.value) == ("initiate: establishing CHILD_SA 'c' failed [charon log: received NO_PROPOSAL_CHOSEN "
                               "notify, no CHILD_SA built | failed to establish CHILD_SA, keeping IKE_SA]")
    assert gateway.version().daemon == "charon"
