"""Host's one-time invitations: a user with nothing but a phone joins.

An administrator invites a user for one device platform (:meth:`HostInvitations.invite`): Host
answers the invitation's secret once, for a link whose fragment carries it
(``/ui/join#i=<secret>``), and keeps only the secret's SHA-256. The phone's page makes the
user's Ed25519 and X25519 keys in the browser and redeems the invitation with their public
halves, signed by the new Ed25519 key (:meth:`HostInvitations.redeem`). In one transaction
Host spends the invitation, enrols those keys for the user and grants them exactly one device
enrolment of the invitation's platform; the enrolment that follows is an ordinary device
request (:meth:`app.services.agent.host.HostAgent.handle`), which spends the grant
(:func:`take_grant`). Keys registered from an invitation ask for nothing else: a second
enrolment without a new invitation, or a plain tunnel, is refused.

Who an invitation may be for: a user id that is not enrolled, or was revoked (the phone's keys
enrol it); or a user whose keys came from an earlier invitation, in which case only that
phone's keys (the page finds them in its storage) may redeem it, for one more enrolment. A
user enrolled with keys of their own (``qoss agent keygen``) is not invited: their phone gets a
user id of its own (say ``alice-phone``), so the two never share or replace each other's keys.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.agent import AgentRejected, EnrolledUser, Kind, b64d, b64e, check_fresh, valid_id
from app.domain.agent.codec import decode_canonical
from app.domain.agent.ports import AgentCrypto, AgentRequest, AgentStore, Invitation
from app.domain.errors import AlreadyExists, InvalidInput, NotFound

__all__ = [
    "INVITATION_DEFAULT_TTL",
    "INVITATION_MAX_TTL",
    "INVITATION_PLATFORMS",
    "HostInvitations",
    "InvitationRefused",
    "Redeemed",
    "invitation_link_id",
    "join_link",
    "take_grant",
]

#: How long an invitation lives unless asked otherwise, and at most (seconds).
INVITATION_DEFAULT_TTL = 15 * 60
INVITATION_MAX_TTL = 24 * 3600
#: The platforms of a phone or a laptop that joins from its browser.
INVITATION_PLATFORMS = ("android", "apple", "windows", "networkmanager")
#: The minimums an invitation may set, each 0-10.
_LEVELS = ("confidentiality", "integrity", "key_exchange")
#: The largest signed redemption accepted (its body is a few hundred bytes).
_MAX_REDEEM_BODY = 1024


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def invitation_link_id(secret: str) -> str:
    """What the audit log names an invitation's link by: the first 12 hex digits of its secret's
    SHA-256 (the secret itself is written nowhere)."""
    return _digest(secret)[:12]


class InvitationRefused(NotFound):
    """An invitation that cannot be redeemed: unknown, used, expired or revoked. ``state`` says
    which (``unknown``, ``used``, ``expired``, ``revoked``); each counts as a failed
    authentication of the address that tried it."""

    def __init__(self, state: str, detail: str) -> None:
        super().__init__(detail)
        self.state = state


@dataclass(frozen=True, slots=True)
class Redeemed:
    """What the phone's page needs after redeeming: who it enrols, the platform and the request's
    Objective-ID and minimums; ``audit`` names the invitation, never its secret."""

    user_id: str
    platform: str
    objective: int
    minimums: dict[str, int]
    invitation_id: str
    audit: str

    def as_dict(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "platform": self.platform, "objective": self.objective,
                "minimums": dict(self.minimums), "invitation_id": self.invitation_id}


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _state(invitation: Invitation, now: datetime) -> str:
    if invitation.revoked_at is not None:
        return "revoked"
    if invitation.used_at is not None:
        return "used"
    return "expired" if invitation.expires_at <= now else "waiting"


def _listed(invitation: Invitation, now: datetime) -> dict[str, Any]:
    return {"id": invitation.id, "user_id": invitation.user_id, "platform": invitation.platform,
            "objectives": list(invitation.objectives), "minimums": dict(invitation.minimums),
            "created_by": invitation.created_by, "created_at": invitation.created_at.isoformat(),
            "expires_at": invitation.expires_at.isoformat(), "used_at": _iso(invitation.used_at),
            "revoked_at": _iso(invitation.revoked_at), "state": _state(invitation, now),
            "enrolled_at": _iso(invitation.grant_spent_at)}


def _minimums(levels: Mapping[str, int] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, level in (levels or {}).items():
        if name not in _LEVELS or isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 10:
            raise InvalidInput(f"minimums are {', '.join(_LEVELS)}, each 0-10")
        if level:
            out[name] = level
    return out


class HostInvitations:
    """Host's invitations over the agent's store.

    Args:
        host_id: Host's own id (a redemption is signed for it).
        store: the agent's state; ``crypto`` checks a redemption's signature and reads its keys.
    """

    def __init__(self, *, host_id: str, store: AgentStore, crypto: AgentCrypto,
                 clock: Callable[[], float] = time.time) -> None:
        self._host_id = host_id
        self._store = store
        self._crypto = crypto
        self._clock = clock

    def invite(self, *, user_id: str, platform: str, created_by: str, ttl: int = INVITATION_DEFAULT_TTL,
               objectives: list[int] | None = None, minimums: Mapping[str, int] | None = None,
               ) -> tuple[str, dict[str, Any]]:
        """Make an invitation: its secret (answered this once, kept nowhere) and its listing.

        Args:
            user_id: whom it enrols. platform: one of :data:`INVITATION_PLATFORMS`.
            created_by: who made it (a token's or a console user's name), for the listing and audit.
            ttl: seconds it lives, 60 to :data:`INVITATION_MAX_TTL`.
            objectives: the Objective-IDs the user may ask for (default ``[3]``, ESP).
            minimums: levels the device's suite must reach at least (``confidentiality``,
                ``integrity``, ``key_exchange``).

        Raises:
            InvalidInput: a bad user id, platform, lifetime, objective or minimum.
            AlreadyExists: the user is enrolled with keys of their own (not from an invitation).
        """
        if not valid_id(user_id):
            raise InvalidInput("a user id is 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
        if platform not in INVITATION_PLATFORMS:
            raise InvalidInput(f"an invitation's platform is one of {', '.join(INVITATION_PLATFORMS)}")
        if not 60 <= ttl <= INVITATION_MAX_TTL:
            raise InvalidInput(f"an invitation lives 60 to {INVITATION_MAX_TTL} s")
        wanted = sorted(set(objectives or [3]))
        if any(o not in (1, 2, 3, 4) for o in wanted):
            raise InvalidInput("objectives are Objective-IDs 1-4 (Liu et al. Table 2-2)")
        levels = _minimums(minimums)
        now = datetime.fromtimestamp(self._clock(), UTC)
        secret = secrets.token_urlsafe(32)
        invitation = Invitation(
            id=secrets.token_hex(8), digest=_digest(secret), user_id=user_id, platform=platform,
            objectives=tuple(wanted), minimums=levels, created_by=created_by[:128] or "unknown", created_at=now,
            expires_at=datetime.fromtimestamp(now.timestamp() + ttl, UTC))
        with self._store.unit() as uow:
            user = uow.users.find(user_id)
            if user is not None and not user.revoked and not uow.invitations.invited(
                    user_id, b64e(user.sign_public_key)):
                raise AlreadyExists(
                    f"{user_id} is enrolled with keys of their own: invite their phone under a user id of "
                    f"its own (e.g. {user_id[:57]}-phone), or revoke {user_id} first")
            uow.invitations.add(invitation)
            uow.commit()
        return secret, _listed(invitation, now)

    def list(self, *, user_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The invitations, newest first, with their state (``waiting``, ``used``, ``expired``,
        ``revoked``); never a secret (Host has none to show)."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        with self._store.unit() as uow:
            return [_listed(i, now) for i in uow.invitations.select(user_id=user_id, limit=limit)]

    def revoke(self, invitation_id: str) -> dict[str, Any]:
        """Revoke an invitation nobody redeemed yet: its link is refused from now on.

        Raises:
            NotFound: no such invitation. AlreadyExists: it was used or revoked already.
        """
        now = datetime.fromtimestamp(self._clock(), UTC)
        with self._store.unit() as uow:
            found = uow.invitations.get(invitation_id)
            if found is None:
                raise NotFound(f"no invitation {invitation_id}")
            if not uow.invitations.revoke(invitation_id, now):
                raise AlreadyExists(f"invitation {invitation_id} was {_state(found, now)} already")
            uow.commit()
            return _listed(uow.invitations.get(invitation_id) or found, now)

    def redeem(self, body: bytes, signature: str) -> Redeemed:
        """Redeem an invitation with a phone's new keys: spend it, enrol the keys and grant one
        device enrolment, in one transaction.

        ``body`` is the canonical JSON the phone signed with its new Ed25519 key as
        :attr:`~app.domain.agent.Kind.INVITATION`: ``host`` (this Host), ``invitation`` (the
        secret), ``sign_public_key`` and ``kem_public_key`` (unpadded base64url), ``platform`` and
        ``ts`` (now, in seconds). The signature proves the phone holds the key it registers.

        Raises:
            InvalidInput: a malformed body (the invitation is not spent).
            AgentRejected: the signature does not match the keys, the body is for another Host or
                not fresh (the invitation is not spent).
            InvitationRefused: unknown, used, expired or revoked.
            AlreadyExists: the user is enrolled with other keys; or the phone chose another
                platform than the invitation's (not spent either way).
        """
        now = self._clock()
        try:
            fields = decode_canonical(body, max_size=_MAX_REDEEM_BODY)
        except AgentRejected as exc:
            raise InvalidInput("the redemption's body is not canonical JSON") from exc
        if set(fields) != {"host", "invitation", "kem_public_key", "platform", "sign_public_key", "ts"}:
            raise InvalidInput("a redemption names host, invitation, kem_public_key, platform, "
                               "sign_public_key and ts")
        secret, platform, ts = fields["invitation"], fields["platform"], fields["ts"]
        if not isinstance(secret, str) or not 20 <= len(secret) <= 64:
            raise InvitationRefused("unknown", "no such invitation")
        if not isinstance(ts, int) or isinstance(ts, bool) or not isinstance(platform, str):
            raise InvalidInput("ts is a whole number of seconds and platform a name")
        try:
            keys = self._crypto.public_keys(str(fields["sign_public_key"]), str(fields["kem_public_key"]))
            tag = b64d(signature, size=64)
        except (AgentRejected, InvalidInput) as exc:
            raise InvalidInput("the keys and the signature are unpadded base64url (32 and 64 bytes)") from exc
        self._crypto.verify(keys.sign, Kind.INVITATION, body, tag)
        if fields["host"] != self._host_id:
            raise AgentRejected("signed for another host")
        check_fresh(ts, now)
        when = datetime.fromtimestamp(now, UTC)
        digest = _digest(secret)
        with self._store.unit() as uow:
            found = uow.invitations.by_digest(digest)
            if found is None:
                raise InvitationRefused("unknown", "no such invitation")
            state = _state(found, when)
            if state != "waiting":
                raise InvitationRefused(state, f"this invitation was {state}" if state != "expired"
                                        else "this invitation expired")
            if platform != found.platform:
                raise AlreadyExists(f"this invitation is for {found.platform}, not {platform}: choose "
                                    f"{found.platform}, or ask for an invitation for {platform}")
            user = uow.users.find(found.user_id)
            sign = b64e(keys.sign)
            if user is not None and not user.revoked:
                if user.sign_public_key != keys.sign or not uow.invitations.invited(found.user_id, sign):
                    raise AlreadyExists(f"{found.user_id} already has keys on another device: ask for an "
                                        "invitation under another user id")
            else:
                uow.users.enroll(EnrolledUser(user_id=found.user_id, sign_public_key=keys.sign,
                                              kem_public_key=keys.kem, objectives=frozenset(found.objectives)))
            if not uow.invitations.redeem(found.id, sign_public_key=sign, now=when):
                raise InvitationRefused("used", "this invitation was used")
            uow.commit()
        objective = 3 if 3 in found.objectives else found.objectives[0]
        return Redeemed(user_id=found.user_id, platform=found.platform, objective=objective,
                        minimums=dict(found.minimums), invitation_id=found.id,
                        audit=f"invitation redeemed: id={found.id} user={found.user_id} platform={found.platform} "
                              f"link={invitation_link_id(secret)}")

    def give_back(self, invitation_id: str) -> None:
        """Give back a device enrolment whose enrolment failed at the target, so that the phone may
        try again."""
        with self._store.unit() as uow:
            uow.invitations.restore_grant(invitation_id)
            uow.commit()


def take_grant(transaction: AgentRequest, user: EnrolledUser, *, platform: str | None,
               min_levels: Mapping[str, int], now: float) -> str | None:
    """Spend the device enrolment an invitation granted these keys, in the request's transaction.

    Keys of the user's own (no invitation registered them) need no grant: None. Keys from an
    invitation enrol one device of the granted platform, at the invitation's minimums or above,
    per grant, and ask for nothing else; the answer is the invitation whose grant was spent.

    Raises:
        AgentRejected: keys from an invitation with no unspent grant for this request.
    """
    grants = transaction.device_grants(user.user_id, user.sign_public_key)
    if not grants:
        return None
    if platform is None:
        raise AgentRejected(f"keys from an invitation enrol devices only: user={user.user_id}")
    for grant in grants:
        if grant.spent_at is not None or grant.platform != platform:
            continue
        if any(min_levels.get(name, 0) < level for name, level in grant.minimums.items()):
            raise AgentRejected(f"below the invitation's minimums: user={user.user_id}")
        if transaction.spend_grant(grant.invitation_id, datetime.fromtimestamp(now, UTC)):
            return grant.invitation_id
    raise AgentRejected(f"no device enrolment granted: user={user.user_id} platform={platform}")


def join_link(base: str, secret: str) -> str:
    """The link an invitation is opened with: the phone's page, the secret in the fragment (a
    browser never sends a fragment, so it reaches no log and no referrer)."""
    return f"{base.rstrip('/')}/ui/join#i={secret}"
