"""The agent's messages: the client's request and what it asks for, an enrolled user, the
Host's endorsement and revocation, the Target's response and the tunnelling information in
it. Each knows its fields, their order and the checks a receiver makes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.domain.agent.codec import *  # noqa: F403
from app.domain.agent.codec import (
    MAX_SEALED_BYTES,
    MLKEM_PUBLIC_BYTES,
    AgentRejected,
    _fields,
    _int,
    _str,
    _str_list,
    b64d,
    b64e,
    canonical,
    decode_canonical,
)
from app.domain.agent.wire import Kind

__all__ = [
    "MAX_DEVICES_LISTED",
    "MAX_RESPONSE_BYTES",
    "AgentSessionState",
    "ClientRequest",
    "DeviceBundle",
    "DeviceInfo",
    "DeviceState",
    "Endorsement",
    "EnrolledUser",
    "RequestInfo",
    "Response",
    "Revocation",
    "SessionStatus",
    "TunnelingInfo",
    "UserDeviceList",
    "UserDevices",
    "device_state",
]

class AgentSessionState(StrEnum):
    """A tunnel Target set up for a client: active until closed, expired, revoked or failed."""

    ACTIVE = "active"
    CLOSED = "closed"
    EXPIRED = "expired"
    REVOKED = "revoked"
    FAILED = "failed"



_NONCE = 16
#: A post-quantum preshared key's id, as a conn's ``ppk_id`` names it.
_PPK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Liu et al.'s "Request Info": which target, what the client's charon can do, what it needs.

    ``min_levels`` are the client's minimums by name (``confidentiality``, ``integrity``,
    ``key_exchange``, ``post_quantum``; one left out is 0);
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
    platform: str | None = None

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
        if self.platform is not None:
            out["platform"] = self.platform
        return out

    @classmethod
    def from_dict(cls, obj: Any) -> RequestInfo:
        if not isinstance(obj, dict):
            raise AgentRejected("bad request_info")
        _fields(obj, ("ah", "lifetime", "min_levels", "supports", "target", "transport"),
                ("ike_address", "platform", "ticket"))
        levels = obj["min_levels"]
        if not isinstance(levels, dict):
            raise AgentRejected("bad min_levels")
        _fields(levels, (), ("confidentiality", "integrity", "key_exchange", "post_quantum"))
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
            platform=_str(obj, "platform", max_len=24, pattern=re.compile(r"^[a-z][a-z0-9-]{1,23}$"))
            if "platform" in obj else None,
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
        if (kind in (Kind.DISCONNECT, Kind.STATUS)) != (info.ticket is not None):
            raise AgentRejected("a disconnect or a status query names a ticket, a connect does not")
        if kind in (Kind.DISCONNECT, Kind.STATUS, Kind.DEVICES) and info.platform is not None:
            raise AgentRejected("a disconnect, a status query or a list of devices names no platform")
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
    """A user as Host enrolled them: public keys and the Objective-IDs they may ask for.

    ``mlkem_public_key`` (ML-KEM-768, 1,184 bytes) is None for keys made without one (a browser's):
    Target's answers to such a user are sealed with X25519 alone and never carry a post-quantum
    preshared key."""

    user_id: str
    sign_public_key: bytes
    kem_public_key: bytes
    objectives: frozenset[int]
    revoked: bool = False
    mlkem_public_key: bytes | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "sign_public_key": b64e(self.sign_public_key),
            "kem_public_key": b64e(self.kem_public_key),
            **({"mlkem_public_key": b64e(self.mlkem_public_key)} if self.mlkem_public_key is not None else {}),
            "objectives": sorted(self.objectives),
        }

    @classmethod
    def from_dict(cls, obj: Any) -> EnrolledUser:
        if not isinstance(obj, dict):
            raise AgentRejected("bad user")
        _fields(obj, ("kem_public_key", "objectives", "sign_public_key", "user_id"), ("mlkem_public_key",))
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
            mlkem_public_key=b64d(obj["mlkem_public_key"], size=MLKEM_PUBLIC_BYTES) if "mlkem_public_key" in obj
            else None,
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
        if obj["client_kind"] not in (Kind.CONNECT.value, Kind.DISCONNECT.value, Kind.STATUS.value,
                                      Kind.DEVICES.value):
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
    """Liu et al.'s "Tunneling Info": everything the client needs to bring the tunnel up.

    ``ppk_id`` names the post-quantum preshared key (RFC 8784) the tunnel requires, whose key is
    the response's ``ppk``; None: the tunnel has none.
    """

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
    ppk_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ticket": self.ticket, "protection": self.protection, "target_address": self.target_address,
            "target_identity": self.target_identity, "client_identity": self.client_identity,
            "remote_ts": list(self.remote_ts), "ike_proposal": self.ike_proposal, "esp_proposal": self.esp_proposal,
            "mode": self.mode, "suite": dict(self.suite), "notes": list(self.notes), "expires": self.expires,
            **({"ppk_id": self.ppk_id} if self.ppk_id is not None else {}),
        }

    @classmethod
    def from_dict(cls, obj: Any) -> TunnelingInfo:
        if not isinstance(obj, dict):
            raise AgentRejected("bad tunneling_info")
        _fields(obj, ("client_identity", "esp_proposal", "expires", "ike_proposal", "mode", "notes", "protection",
                      "remote_ts", "suite", "target_address", "target_identity", "ticket"), ("ppk_id",))
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
            ppk_id=_str(obj, "ppk_id", max_len=64, pattern=_PPK_ID) if "ppk_id" in obj else None,
        )


_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_MEDIA_TYPE = re.compile(r"^[a-z0-9.+/-]{3,60}(; ?charset=[a-z0-9-]{1,16})?$")


@dataclass(frozen=True, slots=True)
class DeviceBundle:
    """What a device enrolment gives the user: the profile for the platform's VPN client, the
    files it names beside it, and the one-time passphrase of the device's PKCS#12 (shown once,
    kept nowhere by Target)."""

    platform: str
    profile_name: str
    media_type: str
    profile: bytes
    files: Mapping[str, bytes]
    passphrase: str
    ca_cert: bytes
    not_after: int

    def as_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "profile_name": self.profile_name, "media_type": self.media_type,
                "profile": b64e(self.profile), "files": {k: b64e(v) for k, v in sorted(self.files.items())},
                "passphrase": self.passphrase, "ca_cert": b64e(self.ca_cert), "not_after": self.not_after}

    @classmethod
    def from_dict(cls, obj: Any, *, max_size: int) -> DeviceBundle:
        if not isinstance(obj, dict):
            raise AgentRejected("bad device")
        _fields(obj, ("ca_cert", "files", "media_type", "not_after", "passphrase", "platform", "profile",
                      "profile_name"))
        files = obj["files"]
        if not isinstance(files, dict) or len(files) > 4 or not all(
                isinstance(k, str) and _FILE_NAME.match(k) for k in files):
            raise AgentRejected("bad device files")
        return cls(
            platform=_str(obj, "platform", max_len=24, pattern=re.compile(r"^[a-z][a-z0-9-]{1,23}$")),
            profile_name=_str(obj, "profile_name", max_len=80, pattern=_FILE_NAME),
            media_type=_str(obj, "media_type", max_len=80, pattern=_MEDIA_TYPE),
            profile=b64d(obj["profile"], max_size=max_size),
            files={k: b64d(v, max_size=max_size) for k, v in files.items()},
            passphrase=_str(obj, "passphrase", max_len=64, pattern=re.compile(r"^[A-Za-z0-9-]{12,64}$")),
            ca_cert=b64d(obj["ca_cert"], max_size=8192),
            not_after=_int(obj, "not_after", 0, 2**40),
        )

    def __repr__(self) -> str:  # never show the passphrase or the key inside the profile
        return f"DeviceBundle(platform={self.platform}, profile_name={self.profile_name})"


#: A response may carry a device's profile and files: larger than what a server ever accepts.
MAX_RESPONSE_BYTES = 65_536


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
        return canonical({
            "kind": Kind.HANDOFF.value, "sender": self.user_id, "recipient": self.host, "nonce": b64e(self.nonce),
            "ts": self.timestamp, "profile_name": self.profile_name, "media_type": self.media_type,
            "profile": b64e(self.profile), "ttl": self.ttl,
        })

    @classmethod
    def parse(cls, body: bytes) -> Handoff:
        obj = decode_canonical(body, max_size=MAX_RESPONSE_BYTES)
        _fields(obj, ("kind", "media_type", "nonce", "profile", "profile_name", "recipient", "sender", "ts", "ttl"))
        if obj["kind"] != Kind.HANDOFF.value:
            raise AgentRejected("signed kind differs from the header")
        return cls(user_id=_str(obj, "sender"), host=_str(obj, "recipient"), nonce=b64d(obj["nonce"], size=_NONCE),
                   timestamp=_int(obj, "ts", 0, 2**40),
                   profile_name=_str(obj, "profile_name", max_len=80, pattern=_FILE_NAME),
                   media_type=_str(obj, "media_type", max_len=80, pattern=_MEDIA_TYPE),
                   profile=b64d(obj["profile"], max_size=32_768), ttl=_int(obj, "ttl", 30, 3600))

    def __repr__(self) -> str:
        return f"Handoff(user_id={self.user_id}, profile_name={self.profile_name})"


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """What Target says of a ticket asked after (Kind.STATUS): its state, and why it ended (e.g.
    an edit left a device's suite below its minimums: its profile is stale)."""

    ticket: str
    state: AgentSessionState
    reason: str
    platform: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"ticket": self.ticket, "state": self.state.value, "reason": self.reason,
                "platform": self.platform}

    @classmethod
    def from_dict(cls, obj: object) -> SessionStatus:
        if not isinstance(obj, dict):
            raise AgentRejected("bad status")
        _fields(obj, ("platform", "reason", "state", "ticket"))
        try:
            state = AgentSessionState(obj["state"])
        except ValueError:
            raise AgentRejected("bad status state") from None
        reason = obj["reason"]
        if not isinstance(reason, str) or len(reason) > 500 or not reason.isprintable():
            raise AgentRejected("bad status reason")
        platform = obj["platform"]
        return cls(ticket=_str(obj, "ticket"), state=state, reason=reason,
                   platform=_str(obj, "platform") if platform is not None else None)


class DeviceState(StrEnum):
    """A device enrolment as its user sees it: ``active``; ``stale`` (an edit of the ratings or
    policies left its suite below its minimums: its profile no longer joins, enrol it again);
    ``revoked`` (by its user, an administrator, or with the user); ``expired`` (its certificate's
    time is up); ``ended`` (anything else: its conn could not be loaded again)."""

    ACTIVE = "active"
    STALE = "stale"
    REVOKED = "revoked"
    EXPIRED = "expired"
    ENDED = "ended"


#: What a closing reason says of a device whose profile an edit left below its minimums
#: (:func:`app.services.agent.target_edits.close_reason`).
_STALE_MARK = "its profile is stale"


def device_state(state: AgentSessionState, reason: str) -> DeviceState:
    """What a device enrolment's session state and closing reason mean to its user."""
    if state is AgentSessionState.ACTIVE:
        return DeviceState.ACTIVE
    if _STALE_MARK in reason:
        return DeviceState.STALE
    return {AgentSessionState.REVOKED: DeviceState.REVOKED,
            AgentSessionState.EXPIRED: DeviceState.EXPIRED}.get(state, DeviceState.ENDED)


#: The most device enrolments a list carries (the newest first).
MAX_DEVICES_LISTED = 64

_TICKET = re.compile(r"^[0-9a-f]{32}$")
_PLATFORM = re.compile(r"^[a-z][a-z0-9-]{1,23}$")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One of a user's device enrolments at a Target: its ticket, platform, state and why it ended,
    the Objective-ID it was enrolled for, when it was enrolled, when its certificate expires and
    when it ended (None while active). No key, no passphrase: Target keeps neither."""

    ticket: str
    platform: str
    state: DeviceState
    reason: str
    objective_id: int
    created: int
    expires: int
    ended: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"ticket": self.ticket, "platform": self.platform, "state": self.state.value, "reason": self.reason,
                "objective_id": self.objective_id, "created": self.created, "expires": self.expires,
                "ended": self.ended}

    @classmethod
    def from_dict(cls, obj: object) -> DeviceInfo:
        if not isinstance(obj, dict):
            raise AgentRejected("bad device")
        _fields(obj, ("created", "ended", "expires", "objective_id", "platform", "reason", "state", "ticket"))
        try:
            state = DeviceState(obj["state"])
        except ValueError:
            raise AgentRejected("bad device state") from None
        reason = obj["reason"]
        if not isinstance(reason, str) or len(reason) > 500 or not reason.isprintable():
            raise AgentRejected("bad device reason")
        return cls(ticket=_str(obj, "ticket", max_len=32, pattern=_TICKET),
                   platform=_str(obj, "platform", max_len=24, pattern=_PLATFORM), state=state, reason=reason,
                   objective_id=_int(obj, "objective_id", 1, 4), created=_int(obj, "created", 0, 2**40),
                   expires=_int(obj, "expires", 0, 2**40),
                   ended=None if obj["ended"] is None else _int(obj, "ended", 0, 2**40))


def _devices(obj: Mapping[str, Any], key: str) -> tuple[DeviceInfo, ...]:
    items = obj[key]
    if not isinstance(items, list) or len(items) > MAX_DEVICES_LISTED:
        raise AgentRejected("bad device list")
    return tuple(DeviceInfo.from_dict(item) for item in items)


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
        return canonical({"kind": Kind.USER_DEVICES.value, "sender": self.host, "recipient": self.target,
                          "nonce": b64e(self.nonce), "ts": self.timestamp, "user_id": self.user_id,
                          "revoke": self.revoke})

    @classmethod
    def parse(cls, body: bytes) -> UserDevices:
        obj = decode_canonical(body, max_size=MAX_SEALED_BYTES)
        _fields(obj, ("kind", "nonce", "recipient", "revoke", "sender", "ts", "user_id"))
        if obj["kind"] != Kind.USER_DEVICES.value:
            raise AgentRejected("signed kind differs from the header")
        return cls(host=_str(obj, "sender"), target=_str(obj, "recipient"), nonce=b64d(obj["nonce"], size=_NONCE),
                   timestamp=_int(obj, "ts", 0, 2**40), user_id=_str(obj, "user_id"),
                   revoke=None if obj["revoke"] is None else _str(obj, "revoke", max_len=32, pattern=_TICKET))


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
        return canonical({"kind": Kind.USER_DEVICE_LIST.value, "sender": self.target, "recipient": self.host,
                          "nonce": b64e(self.nonce), "ts": self.timestamp, "user_id": self.user_id,
                          "devices": [d.as_dict() for d in self.devices], "revoked": self.revoked})

    @classmethod
    def parse(cls, body: bytes) -> UserDeviceList:
        obj = decode_canonical(body, max_size=MAX_RESPONSE_BYTES)
        _fields(obj, ("devices", "kind", "nonce", "recipient", "revoked", "sender", "ts", "user_id"))
        if obj["kind"] != Kind.USER_DEVICE_LIST.value:
            raise AgentRejected("signed kind differs from the header")
        return cls(target=_str(obj, "sender"), host=_str(obj, "recipient"), nonce=b64d(obj["nonce"], size=_NONCE),
                   timestamp=_int(obj, "ts", 0, 2**40), user_id=_str(obj, "user_id"),
                   devices=_devices(obj, "devices"),
                   revoked=None if obj["revoked"] is None else _str(obj, "revoked", max_len=32, pattern=_TICKET))


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
        return canonical({
            **({"device": self.device.as_dict()} if self.device is not None else {}),
            **({"ppk": b64e(self.ppk)} if self.ppk is not None else {}),
            **({"status": self.status.as_dict()} if self.status is not None else {}),
            **({"devices": [d.as_dict() for d in self.devices]} if self.devices is not None else {}),
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
        obj = decode_canonical(body, max_size=MAX_RESPONSE_BYTES)
        _fields(obj, ("kind", "recipient", "request_id", "sender", "session_key", "ts", "tunneling_info", "via"),
                ("device", "devices", "ppk", "status"))
        if obj["kind"] != kind.value:
            raise AgentRejected("signed kind differs from the header")
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
            request_id=b64d(obj["request_id"], size=_NONCE),
            session_key=b64d(obj["session_key"], size=32) if obj["session_key"] is not None else None,
            tunneling_info=info,
            target=_str(obj, "sender"),
            user_id=_str(obj, "recipient"),
            host=_str(obj, "via"),
            timestamp=_int(obj, "ts", 0, 2**40),
            status=SessionStatus.from_dict(obj["status"]) if kind is Kind.STATE else None,
            devices=_devices(obj, "devices") if kind is Kind.DEVICE_LIST else None,
            ppk=b64d(obj["ppk"], size=32) if "ppk" in obj else None,
        )

    def __repr__(self) -> str:  # never show the session key or the PPK
        return f"Response(kind={self.kind.value}, target={self.target}, user_id={self.user_id})"

