"""The agent's messages: the client's request, the Host's endorsement, revocation and question
about a user's devices, a device's handoff, and Target's answers. Each kind's signed body opens
with the same header, written and read here once; what a kind carries besides lives in
:mod:`app.domain.agent.parts`.

The header: ``kind``, ``sender``, ``recipient`` and ``ts`` (seconds), then the message's 16-byte
nonce. A message between two parties names it ``nonce``; one Host relays between a client and
Target (a request and its answer) names it ``request_id`` and adds ``via``, the Host."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.agent.codec import (
    MAX_SEALED_BYTES,
    AgentRejected,
    _fields,
    _int,
    _str,
    b64d,
    b64e,
    canonical,
    decode_canonical,
)
from app.domain.agent.parts import (
    _FILE_NAME,
    _MEDIA_TYPE,
    _TICKET,
    MAX_DEVICES_LISTED,
    DeviceBundle,
    DeviceInfo,
    EnrolledUser,
    RequestInfo,
    SessionStatus,
    TunnelingInfo,
)
from app.domain.agent.wire import Kind

__all__ = [
    "MAX_RESPONSE_BYTES",
    "ClientRequest",
    "Endorsement",
    "Handoff",
    "Response",
    "Revocation",
    "UserDeviceList",
    "UserDevices",
]

#: A response may carry a device's profile and files: larger than what a server ever accepts.
MAX_RESPONSE_BYTES = 65_536

_NONCE = 16
#: The header's fields in every kind's signed body.
_HEAD = ("kind", "recipient", "sender", "ts")


def _signed(kind: Kind, sender: str, recipient: str, nonce: bytes, ts: int, own: Mapping[str, Any], *,
            via: str | None = None) -> bytes:
    """A kind's signed body: the header, and ``own``, what the kind carries besides.

    A message relayed by ``via`` (the Host) names its nonce ``request_id``.
    """
    head: dict[str, Any] = {"kind": kind.value, "sender": sender, "recipient": recipient, "ts": ts}
    head.update({"nonce": b64e(nonce)} if via is None else {"request_id": b64e(nonce), "via": via})
    return canonical({**own, **head})


def _opened(body: bytes, kind: Kind, own: Sequence[str], optional: Sequence[str] = (), *, relayed: bool = False,
            max_size: int = MAX_SEALED_BYTES) -> dict[str, Any]:
    """A kind's signed body, decoded: canonical, no more than ``max_size`` bytes, the header's fields
    and ``own`` (and perhaps ``optional``) and no others, and the kind the header says.

    Raises:
        AgentRejected: the first of those checks that fails.
    """
    obj = decode_canonical(body, max_size=max_size)
    _fields(obj, (*_HEAD, *(("request_id", "via") if relayed else ("nonce",)), *own), optional)
    if obj["kind"] != kind.value:
        raise AgentRejected("signed kind differs from the header")
    return obj


def _nonce(obj: Mapping[str, Any], key: str = "nonce") -> bytes:
    return b64d(obj[key], size=_NONCE)


def _ts(obj: Mapping[str, Any]) -> int:
    return _int(obj, "ts", 0, 2**40)


def _parties(obj: Mapping[str, Any]) -> tuple[str, str, bytes, int]:
    """The header of a message between two parties, checked in this order: sender, recipient,
    nonce, time. Such a kind has these as its first four fields (after an Endorsement's kind)."""
    return _str(obj, "sender"), _str(obj, "recipient"), _nonce(obj), _ts(obj)


def _ticket_or_none(obj: Mapping[str, Any], key: str) -> str | None:
    return None if obj[key] is None else _str(obj, key, max_len=32, pattern=_TICKET)


def _devices(obj: Mapping[str, Any], key: str) -> tuple[DeviceInfo, ...]:
    items = obj[key]
    if not isinstance(items, list) or len(items) > MAX_DEVICES_LISTED:
        raise AgentRejected("bad device list")
    return tuple(DeviceInfo.from_dict(item) for item in items)


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
        return _signed(self.kind, self.user_id, self.host, self.request_id, self.timestamp, {
            "user_id": self.user_id,
            "objective_id": self.objective_id,
            "request_info": self.request_info.as_dict(),
            "target": self.request_info.target,
        }, via=self.host)

    @classmethod
    def parse(cls, body: bytes, *, kind: Kind) -> ClientRequest:
        obj = _opened(body, kind, ("objective_id", "request_info", "target", "user_id"), relayed=True)
        info = RequestInfo.from_dict(obj["request_info"])
        user = _str(obj, "user_id")
        if obj["sender"] != user:
            raise AgentRejected("sender is not the user")
        if obj["target"] != info.target:
            raise AgentRejected("target differs from request_info")
        if obj["via"] != obj["recipient"]:
            raise AgentRejected("via differs from recipient")
        if (kind in (Kind.DISCONNECT, Kind.STATUS)) != (info.ticket is not None):
            raise AgentRejected("a disconnect or a status query names a ticket, a connect does not")
        if kind in (Kind.DISCONNECT, Kind.STATUS, Kind.DEVICES) and info.platform is not None:
            raise AgentRejected("a disconnect, a status query or a list of devices names no platform")
        return cls(
            kind=kind,
            request_id=_nonce(obj, "request_id"),
            user_id=user,
            objective_id=_int(obj, "objective_id", 1, 4),
            request_info=info,
            host=_str(obj, "recipient"),
            timestamp=_ts(obj),
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
        return _signed(Kind.ENDORSE, self.host, self.target, self.nonce, self.timestamp, {
            "user": self.user.as_dict(),
            "client_kind": self.client_kind.value,
            "client_body": b64e(self.client_body),
            "client_tag": b64e(self.client_tag),
        })

    @classmethod
    def parse(cls, body: bytes) -> Endorsement:
        obj = _opened(body, Kind.ENDORSE, ("client_body", "client_kind", "client_tag", "user"))
        if obj["client_kind"] not in (Kind.CONNECT.value, Kind.DISCONNECT.value, Kind.STATUS.value,
                                      Kind.DEVICES.value):
            raise AgentRejected("bad client_kind")
        return cls(
            Kind.ENDORSE,
            *_parties(obj),
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
        return _signed(Kind.REVOKE, self.host, self.target, self.nonce, self.timestamp, {
            "user_id": self.user_id, "sign_public_key": b64e(self.sign_public_key)})

    @classmethod
    def parse(cls, body: bytes) -> Revocation:
        obj = _opened(body, Kind.REVOKE, ("sign_public_key", "user_id"))
        return cls(*_parties(obj), user_id=_str(obj, "user_id"), sign_public_key=b64d(obj["sign_public_key"], size=32))


@dataclass(frozen=True, slots=True)
class Handoff:
    """Client -> Host: a device's profile, to be fetched once from a link (a phone scans it).

    The profile holds the device's PKCS#12 encrypted under a passphrase Host never sees.
    """

    user_id: str
    host: str
    nonce: bytes
    timestamp: int
    profile_name: str
    media_type: str
    profile: bytes
    ttl: int

    def body(self) -> bytes:
        return _signed(Kind.HANDOFF, self.user_id, self.host, self.nonce, self.timestamp, {
            "profile_name": self.profile_name, "media_type": self.media_type, "profile": b64e(self.profile),
            "ttl": self.ttl})

    @classmethod
    def parse(cls, body: bytes) -> Handoff:
        obj = _opened(body, Kind.HANDOFF, ("media_type", "profile", "profile_name", "ttl"),
                      max_size=MAX_RESPONSE_BYTES)
        return cls(*_parties(obj),
                   profile_name=_str(obj, "profile_name", max_len=80, pattern=_FILE_NAME),
                   media_type=_str(obj, "media_type", max_len=80, pattern=_MEDIA_TYPE),
                   profile=b64d(obj["profile"], max_size=32_768), ttl=_int(obj, "ttl", 30, 3600))

    def __repr__(self) -> str:
        return f"Handoff(user_id={self.user_id}, profile_name={self.profile_name})"


@dataclass(frozen=True, slots=True)
class UserDevices:
    """Host -> Target: an administrator asks for a user's devices there, and with ``revoke`` (a
    ticket) revokes that one first. Host vouches for its own users only: Target answers about the
    sessions of that user of that Host."""

    host: str
    target: str
    nonce: bytes
    timestamp: int
    user_id: str
    revoke: str | None = None

    def body(self) -> bytes:
        return _signed(Kind.USER_DEVICES, self.host, self.target, self.nonce, self.timestamp, {
            "user_id": self.user_id, "revoke": self.revoke})

    @classmethod
    def parse(cls, body: bytes) -> UserDevices:
        obj = _opened(body, Kind.USER_DEVICES, ("revoke", "user_id"))
        return cls(*_parties(obj), user_id=_str(obj, "user_id"), revoke=_ticket_or_none(obj, "revoke"))


@dataclass(frozen=True, slots=True)
class UserDeviceList:
    """Target -> Host: the answer to :class:`UserDevices` (its nonce echoed): the user's devices,
    newest first, and ``revoked``, the ticket revoked now (None: none was asked for, or it was not
    this user's active device)."""

    target: str
    host: str
    nonce: bytes
    timestamp: int
    user_id: str
    devices: tuple[DeviceInfo, ...]
    revoked: str | None = None

    def body(self) -> bytes:
        return _signed(Kind.USER_DEVICE_LIST, self.target, self.host, self.nonce, self.timestamp, {
            "user_id": self.user_id, "devices": [d.as_dict() for d in self.devices], "revoked": self.revoked})

    @classmethod
    def parse(cls, body: bytes) -> UserDeviceList:
        obj = _opened(body, Kind.USER_DEVICE_LIST, ("devices", "revoked", "user_id"), max_size=MAX_RESPONSE_BYTES)
        return cls(*_parties(obj), user_id=_str(obj, "user_id"), devices=_devices(obj, "devices"),
                   revoked=_ticket_or_none(obj, "revoked"))


@dataclass(frozen=True, slots=True)
class Response:
    """Target -> Client: ``Request ID || Session Key || Tunneling Info`` (+ Target's signature).

    A disconnect is answered with kind CLOSED, no session key and no tunneling info; a status
    query with kind STATE and ``status`` alone (the ticket's state and why it ended); a list of
    devices with kind DEVICE_LIST and ``devices`` alone (the user's devices at that Target).
    A tunnel with a post-quantum preshared key has it as ``ppk`` (32 bytes; its id is the
    tunneling info's ``ppk_id``): such a response is only ever sealed hybrid.
    """

    kind: Kind
    request_id: bytes
    session_key: bytes | None
    tunneling_info: TunnelingInfo | None
    target: str
    user_id: str
    host: str
    timestamp: int
    device: DeviceBundle | None = None
    status: SessionStatus | None = None
    devices: tuple[DeviceInfo, ...] | None = None
    ppk: bytes | None = None

    def body(self) -> bytes:
        return _signed(self.kind, self.target, self.user_id, self.request_id, self.timestamp, {
            **({"device": self.device.as_dict()} if self.device is not None else {}),
            **({"ppk": b64e(self.ppk)} if self.ppk is not None else {}),
            **({"status": self.status.as_dict()} if self.status is not None else {}),
            **({"devices": [d.as_dict() for d in self.devices]} if self.devices is not None else {}),
            "session_key": b64e(self.session_key) if self.session_key is not None else None,
            "tunneling_info": self.tunneling_info.as_dict() if self.tunneling_info is not None else None,
        }, via=self.host)

    @classmethod
    def parse(cls, body: bytes, *, kind: Kind) -> Response:
        obj = _opened(body, kind, ("session_key", "tunneling_info"), ("device", "devices", "ppk", "status"),
                      relayed=True, max_size=MAX_RESPONSE_BYTES)
        if (kind is Kind.STATE) != ("status" in obj):
            raise AgentRejected("a state answer carries a status, nothing else does")
        if (kind is Kind.DEVICE_LIST) != ("devices" in obj):
            raise AgentRejected("a list of devices carries devices, nothing else does")
        has_tunnel = kind is Kind.RESPONSE
        device = obj.get("device")
        if has_tunnel != (obj["tunneling_info"] is not None) or (
                has_tunnel and device is None) != (obj["session_key"] is not None) or (
                device is not None and not has_tunnel):
            raise AgentRejected("a response carries tunneling info and a session key or a device, a close neither")
        info = TunnelingInfo.from_dict(obj["tunneling_info"]) if has_tunnel else None
        if ("ppk" in obj) != (info is not None and info.ppk_id is not None) or ("ppk" in obj and device is not None):
            raise AgentRejected("a client's tunnel that names a PPK id carries its PPK, nothing else does")
        return cls(
            kind=kind,
            device=DeviceBundle.from_dict(device, max_size=MAX_RESPONSE_BYTES) if device is not None else None,
            request_id=_nonce(obj, "request_id"),
            session_key=b64d(obj["session_key"], size=32) if obj["session_key"] is not None else None,
            tunneling_info=info,
            target=_str(obj, "sender"),
            user_id=_str(obj, "recipient"),
            host=_str(obj, "via"),
            timestamp=_ts(obj),
            status=SessionStatus.from_dict(obj["status"]) if kind is Kind.STATE else None,
            devices=_devices(obj, "devices") if kind is Kind.DEVICE_LIST else None,
            ppk=b64d(obj["ppk"], size=32) if "ppk" in obj else None,
        )

    def __repr__(self) -> str:  # never show the session key or the PPK
        return f"Response(kind={self.kind.value}, target={self.target}, user_id={self.user_id})"
