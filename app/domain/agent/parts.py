"""What the agent's messages carry: the client's request info, an enrolled user, the tunnelling
information and a device's bundle in Target's response, a ticket's status and a user's devices with
their states. Each knows its fields and the checks a receiver makes of them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from app.domain.agent.codec import MLKEM_PUBLIC_BYTES, AgentRejected, _fields, _int, _str, _str_list, b64d, b64e

__all__ = [
    "MAX_DEVICES_LISTED",
    "AgentSessionState",
    "DeviceBundle",
    "DeviceInfo",
    "DeviceState",
    "EnrolledUser",
    "RequestInfo",
    "SessionStatus",
    "TunnelingInfo",
    "device_state",
]

#: The most device enrolments a list carries (the newest first).
MAX_DEVICES_LISTED = 64

#: A ticket, a platform and an IP address, wherever a request, a tunnel or a device names one.
_TICKET = re.compile(r"^[0-9a-f]{32}$")
_PLATFORM = re.compile(r"^[a-z][a-z0-9-]{1,23}$")
_ADDRESS = re.compile(r"^[0-9a-fA-F:.]{2,45}$")


class AgentSessionState(StrEnum):
    """A tunnel Target set up for a client: active until closed, expired, revoked or failed."""

    ACTIVE = "active"
    CLOSED = "closed"
    EXPIRED = "expired"
    REVOKED = "revoked"
    FAILED = "failed"


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
            ike_address=_str(obj, "ike_address", max_len=45, pattern=_ADDRESS) if "ike_address" in obj else None,
            ticket=_str(obj, "ticket", max_len=32, pattern=_TICKET) if "ticket" in obj else None,
            platform=_str(obj, "platform", max_len=24, pattern=_PLATFORM) if "platform" in obj else None,
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


#: A post-quantum preshared key's id, as a conn's ``ppk_id`` names it.
_PPK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


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
            ticket=_str(obj, "ticket", max_len=32, pattern=_TICKET),
            protection=obj["protection"],
            target_address=_str(obj, "target_address", max_len=45, pattern=_ADDRESS),
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
            platform=_str(obj, "platform", max_len=24, pattern=_PLATFORM),
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


_State = TypeVar("_State", AgentSessionState, DeviceState)


def _state_and_reason(obj: Mapping[str, Any], states: type[_State], what: str) -> tuple[_State, str]:
    """A status's or a device's ``state`` (one of ``states``) and ``reason`` (printable, 500 at most)."""
    try:
        state = states(obj["state"])
    except ValueError:
        raise AgentRejected(f"bad {what} state") from None
    reason = obj["reason"]
    if not isinstance(reason, str) or len(reason) > 500 or not reason.isprintable():
        raise AgentRejected(f"bad {what} reason")
    return state, reason


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
        state, reason = _state_and_reason(obj, AgentSessionState, "status")
        platform = obj["platform"]
        return cls(ticket=_str(obj, "ticket"), state=state, reason=reason,
                   platform=_str(obj, "platform") if platform is not None else None)


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
        state, reason = _state_and_reason(obj, DeviceState, "device")
        return cls(ticket=_str(obj, "ticket", max_len=32, pattern=_TICKET),
                   platform=_str(obj, "platform", max_len=24, pattern=_PLATFORM), state=state, reason=reason,
                   objective_id=_int(obj, "objective_id", 1, 4), created=_int(obj, "created", 0, 2**40),
                   expires=_int(obj, "expires", 0, 2**40),
                   ended=None if obj["ended"] is None else _int(obj, "ended", 0, 2**40))

