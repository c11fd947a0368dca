"""Canonical encoding of the agent's messages: UTF-8 JSON with sorted keys, no whitespace,
integers only, bytes as unpadded base64url. A decoder re-encodes what it parsed and refuses
anything that does not come out byte-identical, so every message has exactly one encoding.
Every failed check raises :class:`AgentRejected`."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.domain.errors import Conflict, QossError

__all__ = [
    "ENVELOPE_INFO",
    "MAX_RESPONSE_SEALED_BYTES",
    "MAX_RESPONSE_WIRE_BYTES",
    "MAX_SEALED_BYTES",
    "MAX_WIRE_BYTES",
    "MLKEM_PUBLIC_BYTES",
    "REPLAY_TTL",
    "SIGNATURE_CONTEXT",
    "VERSION",
    "VERSION_HYBRID",
    "WINDOW_BACK",
    "WINDOW_SKEW",
    "AgentRejected",
    "DeviceQuotaExceeded",
    "NoPostQuantumKey",
    "PoolExhausted",
    "TunnelQuotaExceeded",
    "b64d",
    "b64e",
    "canonical",
    "decode_canonical",
    "valid_id",
]

#: An ML-KEM-768 public (encapsulation) key's size (FIPS 203).
MLKEM_PUBLIC_BYTES = 1184
#: The wire version of a message sealed with X25519 alone (HPKE DHKEM-X25519).
VERSION = 1
#: The wire version of a message sealed hybrid: X-Wing (ML-KEM-768 + X25519) as HPKE's KEM.
VERSION_HYBRID = 2
#: A message on the wire (header + sealed part) is refused above this size, before any decryption.
#: Room for the hybrid seal's 1,120-byte encapsulation and an enrolled user's 1,184-byte ML-KEM-768
#: key in an endorsement (in base64url twice over: in the signed body, and that body in the sealed part).
MAX_WIRE_BYTES = 24_576
#: The sealed part, decoded.
MAX_SEALED_BYTES = 16_384
#: The same for Target's answers, which only a client opens and may carry a device's profile.
MAX_RESPONSE_WIRE_BYTES = 131_072
MAX_RESPONSE_SEALED_BYTES = 98_304
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


class NoPostQuantumKey(Conflict):
    """A message carrying a post-quantum preshared key would go to a party whose keys have no
    ML-KEM-768 key: such a message is only ever sealed hybrid (ML-KEM-768 + X25519), so it is not
    sent (409). The party needs keys made with an ML-KEM-768 key (``qoss agent keygen``; a browser
    enrolment has none) enrolled or registered again."""

    def __init__(self, party: str) -> None:
        super().__init__(
            f"{party} has no ML-KEM-768 public key, and a post-quantum preshared key is sent only sealed with "
            "ML-KEM-768 + X25519: enrol keys made by `qoss agent keygen` from the command line (a browser "
            "enrolment has none), or register the peer again with its mlkem_public_key")
        self.party = party


class DeviceQuotaExceeded(Conflict):
    """A user has as many devices enrolled at a Target through their Host as its
    ``devices_per_user`` allows: one must be revoked before another is enrolled (409)."""


class TunnelQuotaExceeded(Conflict):
    """A user has as many tunnels up at a Target through their Host as its ``tunnels_per_user``
    allows: one must be closed (or expire) before another is brought up (409)."""


class PoolExhausted(QossError):
    """Every address of a Target's virtual-IP pool is leased: no tunnel or device gets one until a
    session ends (503: the Target is full, the request itself was fine)."""



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


