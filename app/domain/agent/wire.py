"""A sealed message on the wire: its cleartext header (kind, recipient, version), what a
signature covers, the sealed plaintext, and the freshness window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.domain.agent.codec import (
    ENVELOPE_INFO,
    MAX_RESPONSE_SEALED_BYTES,
    MAX_RESPONSE_WIRE_BYTES,
    MAX_SEALED_BYTES,
    MAX_WIRE_BYTES,
    SIGNATURE_CONTEXT,
    VERSION,
    VERSION_HYBRID,
    WINDOW_BACK,
    WINDOW_SKEW,
    AgentRejected,
    _fields,
    b64d,
    b64e,
    canonical,
    decode_canonical,
)

__all__ = ["Kind", "Wire", "check_fresh", "open_plaintext", "parse_wire", "seal_plaintext", "sealed_hybrid",
           "signed_bytes"]

class Kind(StrEnum):
    """What a sealed message is; part of the header and of what is signed."""

    CONNECT = "connect"          # client -> host
    DISCONNECT = "disconnect"    # client -> host
    ENDORSE = "endorse"          # host -> target (embeds the client's signed body)
    REVOKE = "revoke"            # host -> target
    RESPONSE = "response"        # target -> client (relayed by host)
    CLOSED = "closed"            # target -> client: the ticket's tunnel is gone
    HANDOFF = "handoff"          # client -> host: a device's profile, for a one-time download link
    STATUS = "status"            # client -> host: what became of a ticket (a device's enrolment)
    STATE = "state"              # target -> client: the ticket's state, and why it ended
    DEVICES = "devices"          # client -> host: the user's devices at a target
    DEVICE_LIST = "device-list"  # target -> client: those devices, each with its state
    USER_DEVICES = "user-devices"  # host -> target: a user's devices for the administrator (or revoke one)
    USER_DEVICE_LIST = "user-device-list"  # target -> host: those devices
    PEER_OFFER = "peer-offer"    # a qoss to its peer: the suites it accepts for a tunnel, in its order
    PEER_ANSWER = "peer-answer"  # the peer's choice, its end and the tunnel's key
    PEER_CONFIRM = "peer-confirm"  # the initiator's end is up (or given up)
    PEER_TEARDOWN = "peer-teardown"  # either side takes a tunnel down
    PEER_ACK = "peer-ack"        # a confirm or teardown was acted on
    PEER_MOVE = "peer-move"      # either side: the suites it now accepts for a running tunnel, in its order
    PEER_MOVE_ANSWER = "peer-move-answer"  # the other side's choice for a move, loaded beside the running SA
    PEER_MOVED = "peer-moved"    # the moving side's new SA is up (or given up)
    INVITATION = "invitation"    # a phone -> host: redeems a one-time invitation with its new keys (signed only)



@dataclass(frozen=True, slots=True)
class Wire:
    """A message on the wire: a cleartext header (kind, recipient, version) and the sealed part.

    The version says how it is sealed: 1 with X25519 alone, 2 hybrid (ML-KEM-768 + X25519). The
    header is bound to the seal (it is in the HPKE ``info``), so it cannot be changed without the
    recipient's decryption failing: a hybrid message cannot be passed off as a classic one.
    """

    kind: Kind
    to: str
    sealed: bytes
    hybrid: bool = False

    @property
    def header(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "to": self.to, "v": VERSION_HYBRID if self.hybrid else VERSION}

    def info(self) -> bytes:
        """The HPKE ``info`` of this message."""
        return ENVELOPE_INFO + canonical(self.header)

    def encode(self) -> bytes:
        return canonical({**self.header, "sealed": b64e(self.sealed)})


def parse_wire(data: bytes, *, kinds: Sequence[Kind], to: str) -> Wire:
    """Parse and check a wire message's header before anything is decrypted.

    Raises:
        AgentRejected: too large, malformed, another version, unexpected kind or recipient.
    """
    wire_limit, sealed_limit = limits(kinds)
    if len(data) > wire_limit:
        raise AgentRejected("message too large")
    obj = decode_canonical(data, max_size=wire_limit)
    _fields(obj, ("kind", "sealed", "to", "v"))
    if obj["v"] not in (VERSION, VERSION_HYBRID) or isinstance(obj["v"], bool):
        raise AgentRejected("unknown version")
    kind = obj["kind"]
    if kind not in {k.value for k in kinds}:
        raise AgentRejected("unexpected message kind")
    if obj["to"] != to:
        raise AgentRejected("wrong recipient")
    return Wire(kind=Kind(kind), to=to, sealed=b64d(obj["sealed"], max_size=sealed_limit),
                hybrid=obj["v"] == VERSION_HYBRID)


def sealed_hybrid(data: bytes) -> bool:
    """Whether a wire message that was opened (so checked canonical: ``v`` is its last key) was
    sealed hybrid (version 2: ML-KEM-768 + X25519)."""
    return data.endswith(b',"v":%d}' % VERSION_HYBRID)


def limits(kinds: Sequence[Kind]) -> tuple[int, int]:
    """The largest wire message and sealed part accepted when expecting ``kinds``: Target's
    answers (only a client, or Host for a list it asked for, opens them; a device's profile or a
    list of devices rides in them) and a client's handoff
    of a profile (on a route of its own) may be larger than any other message."""
    if set(kinds) <= {Kind.RESPONSE, Kind.CLOSED, Kind.DEVICE_LIST, Kind.USER_DEVICE_LIST} or set(kinds) == {
            Kind.HANDOFF}:
        return MAX_RESPONSE_WIRE_BYTES, MAX_RESPONSE_SEALED_BYTES
    return MAX_WIRE_BYTES, MAX_SEALED_BYTES


def signed_bytes(kind: Kind, body: bytes) -> bytes:
    """What a signature covers: context label, kind, canonical body."""
    return SIGNATURE_CONTEXT + kind.value.encode() + b"\x00" + body


def seal_plaintext(body: bytes, tag: bytes) -> bytes:
    """The sealed plaintext: the signed body (exact bytes) and its authentication tag."""
    return canonical({"body": b64e(body), "tag": b64e(tag)})


def open_plaintext(plaintext: bytes, *, max_size: int = MAX_SEALED_BYTES) -> tuple[bytes, bytes]:
    """(body, tag) from a decrypted plaintext.

    Raises:
        AgentRejected: malformed.
    """
    obj = decode_canonical(plaintext, max_size=max_size)
    _fields(obj, ("body", "tag"))
    return b64d(obj["body"], max_size=max_size), b64d(obj["tag"], size=64)


def check_fresh(timestamp: int, now: float) -> None:
    """A message's timestamp must lie in ``[now - WINDOW_BACK, now + WINDOW_SKEW]``.

    Raises:
        AgentRejected: too old, or from the future.
    """
    if timestamp < now - WINDOW_BACK:
        raise AgentRejected("expired timestamp")
    if timestamp > now + WINDOW_SKEW:
        raise AgentRejected("timestamp in the future")

