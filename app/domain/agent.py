"""The tunnel agent's messages (seed 001 §2.2): layout, canonical encoding and checks. Pure.

Seed 001 lays a request out as ``Request ID || User ID || Objective-ID || Request Info ||
Authentication Tag`` and a response as ``Request ID || Session Key || Tunneling Info ||
Authentication Tag``. qoss keeps those fields and their order and carries them in
canonical JSON (UTF-8, sorted keys, no whitespace, integers only, bytes as unpadded
base64url). A decoder re-encodes what it parsed and refuses anything that does not come
out byte-identical, so every message has exactly one encoding: a flipped bit either
breaks the encoding or changes what is signed and sealed.

The cryptography (Ed25519 signatures, HPKE seals) lives in ``app.adapters.agent.crypto``;
this module says what is signed, what the sealed envelope's header is, which checks a
receiver makes and in which order. Every failed check raises :class:`AgentRejected`,
whose public text is the same for all of them (an attacker learns nothing from it);
its ``reason`` is for the audit log only.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.domain.errors import QossError

__all__ = [
    "ENVELOPE_INFO",
    "MAX_SEALED_BYTES",
    "MAX_WIRE_BYTES",
    "REPLAY_TTL",
    "SIGNATURE_CONTEXT",
    "WINDOW_BACK",
    "WINDOW_SKEW",
    "AgentRejected",
    "AgentSessionState",
    "ClientRequest",
    "Endorsement",
    "EnrolledUser",
    "Kind",
    "RequestInfo",
    "Response",
    "Revocation",
    "TunnelingInfo",
    "Wire",
    "b64d",
    "b64e",
    "canonical",
    "check_fresh",
    "client_conn",
    "decode_canonical",
    "parse_wire",
    "signed_bytes",
    "target_conn",
    "valid_id",
]

VERSION = 1
#: A message on the wire (header + sealed part) is refused above this size, before any decryption.
MAX_WIRE_BYTES = 16_384
#: The sealed part, decoded.
MAX_SEALED_BYTES = 12_288
#: Freshness: a message may be this many seconds old, or this far in the future (clock skew).
WINDOW_BACK = 60
WINDOW_SKEW = 30
#: How long a (sender, nonce) stays in the replay cache: longer than the window.
REPLAY_TTL = WINDOW_BACK + WINDOW_SKEW + 60
#: HPKE ``info``: a context label, then the canonical header (binds the header to the seal).
ENVELOPE_INFO = b"qoss-agent/v1 envelope\x00"
#: What a signature covers: a context label, the message kind, then the canonical body.
SIGNATURE_CONTEXT = b"qoss-agent/v1 signature\x00"

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_B64 = re.compile(r"^[A-Za-z0-9_-]*$")


class AgentRejected(QossError, PermissionError):
    """A message failed a check. The client sees one fixed text; ``reason`` goes to the audit log."""

    PUBLIC = "the request was rejected"

    def __init__(self, reason: str) -> None:
        super().__init__(self.PUBLIC)
        self.reason = reason

    def detail(self) -> Any:
        return self.PUBLIC


class Kind(StrEnum):
    """What a sealed message is; part of the header and of what is signed."""

    CONNECT = "connect"          # client -> host
    DISCONNECT = "disconnect"    # client -> host
    ENDORSE = "endorse"          # host -> target (embeds the client's signed body)
    REVOKE = "revoke"            # host -> target
    RESPONSE = "response"        # target -> client (relayed by host)
    CLOSED = "closed"            # target -> client: the ticket's tunnel is gone


class AgentSessionState(StrEnum):
    """A tunnel Target set up for a client: active until closed, expired, revoked or failed."""

    ACTIVE = "active"
    CLOSED = "closed"
    EXPIRED = "expired"
    REVOKED = "revoked"
    FAILED = "failed"


def valid_id(value: object) -> bool:
    """A party or user id: 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit."""
    return isinstance(value, str) and bool(_ID.match(value))


# --------------------------------------------------------------------------- encoding


def b64e(data: bytes) -> str:
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64d(text: object, *, size: int | None = None, max_size: int = MAX_SEALED_BYTES) -> bytes:
    """Decode unpadded base64url, refusing any other spelling of the same bytes.

    Raises:
        AgentRejected: not a string, wrong alphabet, padding, non-zero spare bits, wrong size.
    """
    if not isinstance(text, str) or not _B64.match(text) or len(text) > (max_size * 4 + 2) // 3 + 1:
        raise AgentRejected("bad base64")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise AgentRejected("bad base64") from exc
    if b64e(data) != text:
        raise AgentRejected("non-canonical base64")
    if size is not None and len(data) != size:
        raise AgentRejected(f"a {size}-byte field has {len(data)} bytes")
    if len(data) > max_size:
        raise AgentRejected("field too large")
    return data


def canonical(obj: Mapping[str, Any]) -> bytes:
    """The one encoding of a message: sorted keys, no whitespace, ASCII, no floats."""
    _check_types(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _check_types(value: Any, depth: int = 0) -> None:
    if depth > 8:
        raise AgentRejected("too deeply nested")
    kind = type(value)
    if kind is str or kind is bool or value is None:  # the common cases first, without isinstance
        return
    if kind is dict or kind is list or kind is tuple:
        items = value.items() if kind is dict else enumerate(value)
        for k, v in items:
            if kind is dict and type(k) is not str:
                raise AgentRejected("non-string key")
            if type(v) is not str:  # most leaves are strings: no call for them
                _check_types(v, depth + 1)
        return
    if isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if abs(value) > 2**53:
            raise AgentRejected("integer out of range")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise AgentRejected("non-string key")
            _check_types(v, depth + 1)
        return
    if isinstance(value, list | tuple):
        for v in value:
            _check_types(v, depth + 1)
        return
    raise AgentRejected(f"{type(value).__name__} is not allowed in a message")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise AgentRejected("duplicate key")
        out[k] = v
    return out


def _no_float(text: str) -> Any:
    raise AgentRejected("floats are not allowed")


def _no_constant(text: str) -> Any:
    raise AgentRejected("NaN and Infinity are not allowed")


def decode_canonical(data: bytes, *, max_size: int) -> dict[str, Any]:
    """Parse a canonical JSON object, refusing any other encoding of it.

    Raises:
        AgentRejected: too large, not UTF-8 JSON, not an object, or not canonical.
    """
    if not isinstance(data, bytes | bytearray) or len(data) > max_size:
        raise AgentRejected("message too large")
    try:
        obj = json.loads(bytes(data).decode("ascii"), object_pairs_hook=_no_duplicates,
                         parse_float=_no_float, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, AgentRejected):
            raise
        raise AgentRejected("not canonical JSON") from exc
    if not isinstance(obj, dict):
        raise AgentRejected("a message is a JSON object")
    if canonical(obj) != bytes(data):
        raise AgentRejected("not canonical JSON")
    return obj


def _fields(obj: Mapping[str, Any], required: Sequence[str], optional: Sequence[str] = ()) -> None:
    keys = set(obj)
    missing = [k for k in required if k not in keys]
    unknown = keys - set(required) - set(optional)
    if missing or unknown:
        raise AgentRejected(f"fields: missing {sorted(missing)}, unknown {sorted(unknown)}")


def _str(obj: Mapping[str, Any], key: str, *, max_len: int = 64, pattern: re.Pattern[str] | None = _ID) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or len(value) > max_len or (pattern is not None and not pattern.match(value)):
        raise AgentRejected(f"bad {key}")
    return value


def _int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise AgentRejected(f"bad {key}")
    return value


def _str_list(obj: Mapping[str, Any], key: str, *, max_items: int, max_len: int = 64) -> tuple[str, ...]:
    value = obj.get(key)
    if not isinstance(value, list) or len(value) > max_items or not all(
        isinstance(v, str) and 0 < len(v) <= max_len and v.isascii() and v.isprintable() for v in value
    ):
        raise AgentRejected(f"bad {key}")
    return tuple(value)


# --------------------------------------------------------------------------- wire


@dataclass(frozen=True, slots=True)
class Wire:
    """A message on the wire: a cleartext header (kind, recipient) and the sealed part.

    The header is bound to the seal (it is in the HPKE ``info``), so it cannot be changed
    without the recipient's decryption failing.
    """

    kind: Kind
    to: str
    sealed: bytes

    @property
    def header(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "to": self.to, "v": VERSION}

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
    if len(data) > MAX_WIRE_BYTES:
        raise AgentRejected("message too large")
    obj = decode_canonical(data, max_size=MAX_WIRE_BYTES)
    _fields(obj, ("kind", "sealed", "to", "v"))
    if obj["v"] != VERSION or isinstance(obj["v"], bool):
        raise AgentRejected("unknown version")
    kind = obj["kind"]
    if kind not in {k.value for k in kinds}:
        raise AgentRejected("unexpected message kind")
    if obj["to"] != to:
        raise AgentRejected("wrong recipient")
    return Wire(kind=Kind(kind), to=to, sealed=b64d(obj["sealed"], max_size=MAX_SEALED_BYTES))


def signed_bytes(kind: Kind, body: bytes) -> bytes:
    """What a signature covers: context label, kind, canonical body."""
    return SIGNATURE_CONTEXT + kind.value.encode() + b"\x00" + body


def seal_plaintext(body: bytes, tag: bytes) -> bytes:
    """The sealed plaintext: the signed body (exact bytes) and its authentication tag."""
    return canonical({"body": b64e(body), "tag": b64e(tag)})


def open_plaintext(plaintext: bytes) -> tuple[bytes, bytes]:
    """(body, tag) from a decrypted plaintext.

    Raises:
        AgentRejected: malformed.
    """
    obj = decode_canonical(plaintext, max_size=MAX_SEALED_BYTES)
    _fields(obj, ("body", "tag"))
    return b64d(obj["body"]), b64d(obj["tag"], size=64)


def check_fresh(timestamp: int, now: float) -> None:
    """A message's timestamp must lie in ``[now - WINDOW_BACK, now + WINDOW_SKEW]``.

    Raises:
        AgentRejected: too old, or from the future.
    """
    if timestamp < now - WINDOW_BACK:
        raise AgentRejected("expired timestamp")
    if timestamp > now + WINDOW_SKEW:
        raise AgentRejected("timestamp in the future")


# --------------------------------------------------------------------------- messages


_NONCE = 16


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Seed 001's "Request Info": which target, what the client's charon can do, what it needs.

    ``supports`` are the client charon's algorithm keywords (empty: not declared);
    ``ike_address`` is where the client's IKE packets come from (optional; narrows the
    target's conn); ``ticket`` names the tunnel a disconnect is for.
    """

    target: str
    min_levels: Mapping[str, int] = field(default_factory=dict)
    supports: tuple[str, ...] = ()
    ah: bool = False
    transport: bool = False
    lifetime: int = 600
    ike_address: str | None = None
    ticket: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "min_levels": dict(self.min_levels),
            "supports": list(self.supports),
            "ah": self.ah,
            "transport": self.transport,
            "lifetime": self.lifetime,
        }
        if self.ike_address is not None:
            out["ike_address"] = self.ike_address
        if self.ticket is not None:
            out["ticket"] = self.ticket
        return out

    @classmethod
    def from_dict(cls, obj: Any) -> RequestInfo:
        if not isinstance(obj, dict):
            raise AgentRejected("bad request_info")
        _fields(obj, ("ah", "lifetime", "min_levels", "supports", "target", "transport"), ("ike_address", "ticket"))
        levels = obj["min_levels"]
        if not isinstance(levels, dict):
            raise AgentRejected("bad min_levels")
        _fields(levels, (), ("confidentiality", "integrity", "key_exchange"))
        for dim in levels:
            _int(levels, dim, 0, 10)
        if not isinstance(obj["ah"], bool) or not isinstance(obj["transport"], bool):
            raise AgentRejected("bad flags")
        return cls(
            target=_str(obj, "target"),
            min_levels=dict(levels),
            supports=_str_list(obj, "supports", max_items=200),
            ah=obj["ah"],
            transport=obj["transport"],
            lifetime=_int(obj, "lifetime", 30, 86_400),
            ike_address=_str(obj, "ike_address", max_len=45, pattern=re.compile(r"^[0-9a-fA-F:.]{2,45}$"))
            if "ike_address" in obj else None,
            ticket=_str(obj, "ticket", max_len=32, pattern=re.compile(r"^[0-9a-f]{32}$")) if "ticket" in obj else None,
        )


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """Client -> Host: ``Request ID || User ID || Objective-ID || Request Info`` (+ signature).

    The body also names sender (the user), recipient and ``via`` (the host), target and a
    timestamp, so it cannot be taken for a message meant for someone else.
    """

    kind: Kind
    request_id: bytes
    user_id: str
    objective_id: int
    request_info: RequestInfo
    host: str
    timestamp: int

    def body(self) -> bytes:
        return canonical({
            "request_id": b64e(self.request_id),
            "user_id": self.user_id,
            "objective_id": self.objective_id,
            "request_info": self.request_info.as_dict(),
            "kind": self.kind.value,
            "sender": self.user_id,
            "recipient": self.host,
            "via": self.host,
            "target": self.request_info.target,
            "ts": self.timestamp,
        })

    @classmethod
    def parse(cls, body: bytes, *, kind: Kind) -> ClientRequest:
        obj = decode_canonical(body, max_size=MAX_SEALED_BYTES)
        _fields(obj, ("kind", "objective_id", "recipient", "request_id", "request_info", "sender", "target", "ts",
                      "user_id", "via"))
        if obj["kind"] != kind.value:
            raise AgentRejected("signed kind differs from the header")
        info = RequestInfo.from_dict(obj["request_info"])
        user = _str(obj, "user_id")
        if obj["sender"] != user:
            raise AgentRejected("sender is not the user")
        if obj["target"] != info.target:
            raise AgentRejected("target differs from request_info")
        if obj["via"] != obj["recipient"]:
            raise AgentRejected("via differs from recipient")
        if (kind is Kind.DISCONNECT) != (info.ticket is not None):
            raise AgentRejected("a disconnect names a ticket, a connect does not")
        return cls(
            kind=kind,
            request_id=b64d(obj["request_id"], size=_NONCE),
            user_id=user,
            objective_id=_int(obj, "objective_id", 1, 4),
            request_info=info,
            host=_str(obj, "recipient"),
            timestamp=_int(obj, "ts", 0, 2**40),
        )


@dataclass(frozen=True, slots=True)
class EnrolledUser:
    """A user as Host enrolled them: public keys and the Objective-IDs they may ask for."""

    user_id: str
    sign_public_key: bytes
    kem_public_key: bytes
    objectives: frozenset[int]
    revoked: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "sign_public_key": b64e(self.sign_public_key),
            "kem_public_key": b64e(self.kem_public_key),
            "objectives": sorted(self.objectives),
        }

    @classmethod
    def from_dict(cls, obj: Any) -> EnrolledUser:
        if not isinstance(obj, dict):
            raise AgentRejected("bad user")
        _fields(obj, ("kem_public_key", "objectives", "sign_public_key", "user_id"))
        objectives = obj["objectives"]
        if not isinstance(objectives, list) or not all(
            isinstance(o, int) and not isinstance(o, bool) and 1 <= o <= 4 for o in objectives
        ):
            raise AgentRejected("bad objectives")
        return cls(
            user_id=_str(obj, "user_id"),
            sign_public_key=b64d(obj["sign_public_key"], size=32),
            kem_public_key=b64d(obj["kem_public_key"], size=32),
            objectives=frozenset(objectives),
        )


@dataclass(frozen=True, slots=True)
class Endorsement:
    """Host -> Target: Host vouches for the user (keys, allowed objectives) and passes the
    client's signed body on unchanged, so Target checks both the client's intent and Host's word."""

    kind: Kind  # ENDORSE (connect) or DISCONNECT is carried in the client body; this is always ENDORSE
    host: str
    target: str
    nonce: bytes
    timestamp: int
    user: EnrolledUser
    client_kind: Kind
    client_body: bytes
    client_tag: bytes

    def body(self) -> bytes:
        return canonical({
            "kind": Kind.ENDORSE.value,
            "sender": self.host,
            "recipient": self.target,
            "nonce": b64e(self.nonce),
            "ts": self.timestamp,
            "user": self.user.as_dict(),
            "client_kind": self.client_kind.value,
            "client_body": b64e(self.client_body),
            "client_tag": b64e(self.client_tag),
        })

    @classmethod
    def parse(cls, body: bytes) -> Endorsement:
        obj = decode_canonical(body, max_size=MAX_SEALED_BYTES)
        _fields(obj, ("client_body", "client_kind", "client_tag", "kind", "nonce", "recipient", "sender", "ts",
                      "user"))
        if obj["kind"] != Kind.ENDORSE.value:
            raise AgentRejected("signed kind differs from the header")
        if obj["client_kind"] not in (Kind.CONNECT.value, Kind.DISCONNECT.value):
            raise AgentRejected("bad client_kind")
        return cls(
            kind=Kind.ENDORSE,
            host=_str(obj, "sender"),
            target=_str(obj, "recipient"),
            nonce=b64d(obj["nonce"], size=_NONCE),
            timestamp=_int(obj, "ts", 0, 2**40),
            user=EnrolledUser.from_dict(obj["user"]),
            client_kind=Kind(obj["client_kind"]),
            client_body=b64d(obj["client_body"]),
            client_tag=b64d(obj["client_tag"], size=64),
        )


@dataclass(frozen=True, slots=True)
class Revocation:
    """Host -> Target: the user is revoked; take their tunnels down.

    It names the revoked Ed25519 key, so Target can keep its own record and refuse any later
    endorsement of that user with that key (a re-enrolled user has new keys).
    """

    host: str
    target: str
    nonce: bytes
    timestamp: int
    user_id: str
    sign_public_key: bytes

    def body(self) -> bytes:
        return canonical({
            "kind": Kind.REVOKE.value, "sender": self.host, "recipient": self.target,
            "nonce": b64e(self.nonce), "ts": self.timestamp, "user_id": self.user_id,
            "sign_public_key": b64e(self.sign_public_key),
        })

    @classmethod
    def parse(cls, body: bytes) -> Revocation:
        obj = decode_canonical(body, max_size=MAX_SEALED_BYTES)
        _fields(obj, ("kind", "nonce", "recipient", "sender", "sign_public_key", "ts", "user_id"))
        if obj["kind"] != Kind.REVOKE.value:
            raise AgentRejected("signed kind differs from the header")
        return cls(host=_str(obj, "sender"), target=_str(obj, "recipient"), nonce=b64d(obj["nonce"], size=_NONCE),
                   timestamp=_int(obj, "ts", 0, 2**40), user_id=_str(obj, "user_id"),
                   sign_public_key=b64d(obj["sign_public_key"], size=32))


@dataclass(frozen=True, slots=True)
class TunnelingInfo:
    """Seed 001's "Tunneling Info": everything the client needs to bring the tunnel up."""

    ticket: str
    protection: str                 # "esp" or "native" (Objective-ID 1: no IPsec)
    target_address: str
    target_identity: str
    client_identity: str
    remote_ts: tuple[str, ...]
    ike_proposal: str | None
    esp_proposal: str | None
    mode: str
    suite: Mapping[str, Any]
    notes: tuple[str, ...]
    expires: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "ticket": self.ticket, "protection": self.protection, "target_address": self.target_address,
            "target_identity": self.target_identity, "client_identity": self.client_identity,
            "remote_ts": list(self.remote_ts), "ike_proposal": self.ike_proposal, "esp_proposal": self.esp_proposal,
            "mode": self.mode, "suite": dict(self.suite), "notes": list(self.notes), "expires": self.expires,
        }

    @classmethod
    def from_dict(cls, obj: Any) -> TunnelingInfo:
        if not isinstance(obj, dict):
            raise AgentRejected("bad tunneling_info")
        _fields(obj, ("client_identity", "esp_proposal", "expires", "ike_proposal", "mode", "notes", "protection",
                      "remote_ts", "suite", "target_address", "target_identity", "ticket"))
        if not isinstance(obj["suite"], dict):
            raise AgentRejected("bad suite")
        if obj["protection"] not in ("esp", "native") or obj["mode"] not in ("tunnel", "transport"):
            raise AgentRejected("bad protection")
        proposal = re.compile(r"^[a-z0-9_-]{1,200}$")
        return cls(
            ticket=_str(obj, "ticket", max_len=32, pattern=re.compile(r"^[0-9a-f]{32}$")),
            protection=obj["protection"],
            target_address=_str(obj, "target_address", max_len=45, pattern=re.compile(r"^[0-9a-fA-F:.]{2,45}$")),
            target_identity=_str(obj, "target_identity"),
            client_identity=_str(obj, "client_identity"),
            remote_ts=_str_list(obj, "remote_ts", max_items=16),
            ike_proposal=None if obj["ike_proposal"] is None else _str(obj, "ike_proposal", max_len=200,
                                                                       pattern=proposal),
            esp_proposal=None if obj["esp_proposal"] is None else _str(obj, "esp_proposal", max_len=200,
                                                                       pattern=proposal),
            mode=obj["mode"],
            suite=obj["suite"],
            notes=_str_list(obj, "notes", max_items=16, max_len=300),
            expires=_int(obj, "expires", 0, 2**40),
        )


@dataclass(frozen=True, slots=True)
class Response:
    """Target -> Client: ``Request ID || Session Key || Tunneling Info`` (+ Target's signature).

    A disconnect is answered with kind CLOSED, no session key and no tunneling info.
    """

    kind: Kind
    request_id: bytes
    session_key: bytes | None
    tunneling_info: TunnelingInfo | None
    target: str
    user_id: str
    host: str
    timestamp: int

    def body(self) -> bytes:
        return canonical({
            "request_id": b64e(self.request_id),
            "session_key": b64e(self.session_key) if self.session_key is not None else None,
            "tunneling_info": self.tunneling_info.as_dict() if self.tunneling_info is not None else None,
            "kind": self.kind.value,
            "sender": self.target,
            "recipient": self.user_id,
            "via": self.host,
            "ts": self.timestamp,
        })

    @classmethod
    def parse(cls, body: bytes, *, kind: Kind) -> Response:
        obj = decode_canonical(body, max_size=MAX_SEALED_BYTES)
        _fields(obj, ("kind", "recipient", "request_id", "sender", "session_key", "ts", "tunneling_info", "via"))
        if obj["kind"] != kind.value:
            raise AgentRejected("signed kind differs from the header")
        has_tunnel = kind is Kind.RESPONSE
        if has_tunnel != (obj["tunneling_info"] is not None) or has_tunnel != (obj["session_key"] is not None):
            raise AgentRejected("a response carries a session key and tunneling info, a close neither")
        return cls(
            kind=kind,
            request_id=b64d(obj["request_id"], size=_NONCE),
            session_key=b64d(obj["session_key"], size=32) if has_tunnel else None,
            tunneling_info=TunnelingInfo.from_dict(obj["tunneling_info"]) if has_tunnel else None,
            target=_str(obj, "sender"),
            user_id=_str(obj, "recipient"),
            host=_str(obj, "via"),
            timestamp=_int(obj, "ts", 0, 2**40),
        )

    def __repr__(self) -> str:  # never show the session key
        return f"Response(kind={self.kind.value}, target={self.target}, user_id={self.user_id})"


# --------------------------------------------------------------------------- strongSwan configuration


def target_conn(*, name: str, target_address: str, target_identity: str, client_identity: str,
                client_address: str | None, local_ts: Sequence[str], pool: str, ike_proposal: str,
                esp_proposal: str, mode: str, ike_lifetime: int, child_lifetime: int) -> dict[str, Any]:
    """Target's VICI ``load-conn`` body for one client (road warrior with a virtual IP from ``pool``).

    The remote identity is this session's client identity, so the session key (the PSK
    loaded for exactly these two identities) admits this client and no one else.
    """
    return {
        "version": "2",
        "local_addrs": [target_address],
        "remote_addrs": [client_address or "%any"],
        "proposals": [ike_proposal],
        "pools": [pool],
        "unique": "replace",
        "mobike": "no",
        "rekey_time": f"{ike_lifetime}s",
        "local": {"auth": "psk", "id": target_identity},
        "remote": {"auth": "psk", "id": client_identity},
        "children": {name: {
            "local_ts": list(local_ts),
            "esp_proposals": [esp_proposal],
            "mode": mode,
            "start_action": "none",
            "close_action": "none",
            "dpd_action": "clear",
            "rekey_time": f"{child_lifetime}s",
            "life_time": f"{child_lifetime + child_lifetime // 10}s",
        }},
    }


def client_conn(*, name: str, info: TunnelingInfo, client_address: str | None) -> dict[str, Any]:
    """The client's VICI ``load-conn`` body: asks for a virtual IP, reaches Target's protected networks."""
    if info.ike_proposal is None or info.esp_proposal is None:
        raise AgentRejected("no IPsec to configure")
    conn: dict[str, Any] = {
        "version": "2",
        "remote_addrs": [info.target_address],
        "vips": ["0.0.0.0"],  # noqa: S104 - asks the responder for any virtual IP
        "proposals": [info.ike_proposal],
        "mobike": "no",
        "local": {"auth": "psk", "id": info.client_identity},
        "remote": {"auth": "psk", "id": info.target_identity},
        "children": {name: {
            "remote_ts": list(info.remote_ts),
            "esp_proposals": [info.esp_proposal],
            "mode": info.mode,
            "start_action": "none",
            "close_action": "none",
        }},
    }
    if client_address is not None:
        conn["local_addrs"] = [client_address]
    return conn
