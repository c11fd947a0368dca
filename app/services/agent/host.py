"""The agent's Host role (Liu et al. §2.2 steps 1-3 and 5): enrolment, checks, endorsement, relay.

Host holds the enrolled users' public keys and the Objective-IDs each may ask for. It
opens a client's sealed request, checks recipient, enrolment, revocation, signature,
freshness, the objective and non-replay (a unique row per (user, request id)), then
sends the Target a new envelope, signed by Host and sealed to Target, that embeds the
client's signed body unchanged. The Target's answer is sealed to the client: Host
relays bytes it cannot open. This is where qoss departs from the seed, whose Client and
Host share one key pair: here every user has their own keys and the session key is
end-to-end between Target and the client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.agent import (
    REPLAY_TTL,
    AgentRejected,
    ClientRequest,
    Endorsement,
    EnrolledUser,
    Handoff,
    Kind,
    b64e,
    check_fresh,
    sealed_hybrid,
)
from app.domain.agent.messages import UserDeviceList, UserDevices
from app.domain.agent.platforms import PLATFORMS
from app.domain.agent.ports import AgentCrypto, AgentKeys, AgentStore, PeerKeys, Post, WaitingHandoff
from app.domain.agent.sealed_profile import read_sealed
from app.domain.errors import GatewayError, InvalidInput, NotFound, QossError, UnsupportedMediaType
from app.services.agent.config import AgentConfig, HostRole
from app.services.agent.host_revocations import Revocations, RevocationTarget
from app.services.agent.invitations import HostInvitations, take_grant
from app.services.agent.target import Outcome, TargetAgent
from app.services.agent.timing import Steps

__all__ = ["HANDOFF_MAX_TTL", "HANDOFF_TYPES", "Admit", "HostAgent", "link_id"]

#: user id -> None; raises to refuse (the per-user rate limit).
Admit = Callable[[str], None]

#: The profiles Host keeps for a one-time link, by media type, and the file name's ending each
#: has: those that hold everything a phone needs (the platforms whose record has nothing beside
#: the profile, :data:`app.domain.agent.platforms.PLATFORMS`: Android's strongSwan app, Apple's Settings).
HANDOFF_TYPES = {p.media_type: p.suffix for p in PLATFORMS.values() if p.linkable}

#: The longest a one-time link lives, in seconds.
HANDOFF_MAX_TTL = 600


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def link_id(token: str) -> str:
    """What the audit log names a one-time link by: the first 12 hex digits of its secret's SHA-256
    (the secret itself is never written anywhere)."""
    return _digest(token)[:12]


@dataclass(frozen=True, slots=True)
class _Target:
    name: str
    url: str
    keys: PeerKeys


class HostAgent:
    """Host: vouches for enrolled users to the targets it trusts.

    Args:
        keys: Host's own keys; ``crypto`` checks signatures and reads public keys.
        store: the enrolled users and the replay cache (a request's checks: one request transaction).
        local_target: the Target role of this same process (a target whose url is ``local``).
        post: sends a message to a remote Target.
    """

    def __init__(
        self, *, config: AgentConfig, keys: AgentKeys, crypto: AgentCrypto, store: AgentStore, post: Post,
        local_target: TargetAgent | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        if config.host is None:
            raise ValueError("the config has no host role")
        self.role: HostRole = config.host
        self.keys = keys
        self._crypto = crypto
        self.targets = {n: _Target(n, p.url or "", p.keys(config.base_dir, crypto))
                        for n, p in self.role.targets.items()}
        self._store = store
        self._local = local_target
        self._post = post
        self._clock = clock
        #: Revocations sent to the targets, and kept until each confirms (its ``retry`` runs from
        #: the sweeper).
        self.revocations = Revocations(
            keys=keys, store=store, post=post, clock=clock,
            targets={n: RevocationTarget(t.name, t.url, t.keys) for n, t in self.targets.items()},
            local=(lambda wire: local_target.revoke(wire).answer) if local_target is not None else None)
        #: One-time invitations: a phone registers its own keys and enrols one device.
        self.invitations = HostInvitations(host_id=keys.name, store=store, crypto=crypto, clock=clock)

    def published(self) -> dict[str, Any]:
        """What a browser needs to enrol a device through this Host with its user's own keys (the
        console's device page): Host's id and the X25519 key a request is sealed to, and each target's
        Ed25519 key, which checks the answer. Public keys only (base64url)."""
        return {"id": self.keys.name, "kem_public_key": b64e(self.keys.public.kem),
                "targets": {name: b64e(t.keys.sign) for name, t in sorted(self.targets.items())}}

    # -- a device's profile, handed to the phone -------------------------------------------

    def handoff(self, data: bytes, *, admit: Admit | None = None) -> Outcome:
        """Keep an enrolled user's device profile for one download from a link (for a phone to scan):
        the answer is the link's path (``/v1/agent/handoffs/<secret>``). Host keeps only the
        secret's SHA-256, and only a profile sealed by the client
        (:mod:`app.domain.agent.sealed_profile`): under a key Host never sees, so Host can neither
        read it nor change it without the phone's page refusing it.

        Args:
            data: the client's wire message.
            admit: called with the user id once the handoff is genuine, fresh and not a replay
                (the per-user rate limit); whatever it raises refuses it, its nonce unspent.

        Raises:
            AgentRejected: not an enrolled, unrevoked user's genuine, fresh, unreplayed handoff.
            UnsupportedMediaType: not a profile of :data:`HANDOFF_TYPES` (or its file name's
                ending is not that type's).
            InvalidInput: a link asked to live longer than :data:`HANDOFF_MAX_TTL`, or a profile
                not sealed for the link (a profile in clear among others).
        """
        now = self._clock()
        _, body, tag = self.keys.open_sealed(data, kinds=[Kind.HANDOFF])
        handoff = Handoff.parse(body)
        if handoff.host != self.keys.name:
            raise AgentRejected("signed for another host")
        token = secrets.token_urlsafe(32)
        with self._store.request() as transaction:
            user = transaction.find_user(handoff.user_id)
            if user is None or user.revoked:
                raise AgentRejected(f"unknown or revoked user {handoff.user_id}")
            self._crypto.verify(user.sign_public_key, Kind.HANDOFF, body, tag)
            check_fresh(handoff.timestamp, now)
            if not transaction.claim_nonce("host", f"handoff:{user.user_id}", handoff.nonce,
                                           datetime.fromtimestamp(now + REPLAY_TTL, UTC)):
                raise AgentRejected("replayed handoff")
            ending = HANDOFF_TYPES.get(handoff.media_type)
            if ending is None or not handoff.profile_name.endswith(ending):
                raise UnsupportedMediaType(
                    f"a one-time link hands out only {' or '.join(f'{t} ({e})' for t, e in HANDOFF_TYPES.items())}")
            if handoff.ttl > HANDOFF_MAX_TTL:
                raise InvalidInput(f"a one-time link lives at most {HANDOFF_MAX_TTL} s")
            sealed = read_sealed(handoff.profile)  # never a profile Host could read or alter
            if (sealed.media_type, sealed.name) != (handoff.media_type, handoff.profile_name):
                raise InvalidInput("the sealed profile names another file or media type than the handoff")
            if admit is not None:
                admit(user.user_id)
            transaction.commit()
        with self._store.unit() as uow:
            uow.handoffs.purge(datetime.fromtimestamp(now, UTC))
            uow.handoffs.add(digest=_digest(token), user_id=handoff.user_id, profile_name=handoff.profile_name,
                             media_type=handoff.media_type, profile=handoff.profile,
                             expires_at=datetime.fromtimestamp(now + handoff.ttl, UTC))
            uow.commit()
        return Outcome(answer=f"/v1/agent/handoffs/{token}".encode("ascii"),
                       audit=f"handoff user={handoff.user_id} profile={handoff.profile_name} ttl={handoff.ttl} "
                             f"link={link_id(token)}")

    def take_handoff(self, token: str) -> WaitingHandoff | None:
        """The profile behind a link, once; None if the link is unknown, used or expired, or its user
        was revoked since (revoking a user forgets their profiles; one left behind is spent unread)."""
        if not 20 <= len(token) <= 64:
            return None
        with self._store.unit() as uow:
            found = uow.handoffs.take(_digest(token), datetime.fromtimestamp(self._clock(), UTC))
            user = uow.users.find(found.user_id) if found is not None else None
            uow.commit()
        return found if user is not None and not user.revoked else None

    # -- users -------------------------------------------------------------------------

    def enroll(
        self, *, user_id: str, sign_public_key: str, kem_public_key: str, objectives: list[int],
        mlkem_public_key: str | None = None,
    ) -> dict[str, Any]:
        """Enrol a user (or re-enrol a revoked one with new keys); with ``mlkem_public_key`` (keys
        made by ``qoss agent keygen``), Target's answers to the user are sealed hybrid and may carry
        a post-quantum preshared key.

        Raises:
            InvalidInput: bad keys or objectives. AlreadyExists: enrolled already.
        """
        keys = self._crypto.public_keys(sign_public_key, kem_public_key, mlkem_public_key)
        if not objectives or any(o not in (1, 2, 3, 4) for o in objectives):
            raise InvalidInput("objectives are Objective-IDs 1-4 (Liu et al. Table 2-2)")
        user = EnrolledUser(user_id=user_id, sign_public_key=keys.sign, kem_public_key=keys.kem,
                            objectives=frozenset(objectives), mlkem_public_key=keys.mlkem)
        with self._store.unit() as uow:
            uow.users.enroll(user)
            uow.commit()
        return user.as_dict()

    def users(self) -> list[dict[str, Any]]:
        """The enrolled users (public keys only); a revoked one with ``unconfirmed``: the targets
        that have not confirmed the revocation yet, each with the attempts made, when the next is
        due and why the last failed (empty once every target confirmed)."""
        with self._store.unit() as uow:
            return [{**u.as_dict(), "created_at": created.isoformat(),
                     "revoked_at": revoked.isoformat() if revoked else None,
                     **({"unconfirmed": {p.target_id: {"attempts": p.attempts,
                                                        "next_attempt_at": p.next_attempt_at.isoformat(),
                                                        "last_error": p.last_error}
                                         for p in uow.pending_revocations.of_user(u.user_id)}} if revoked else {})}
                    for u, created, revoked in uow.users.all()]

    def revoke(self, user_id: str) -> dict[str, Any]:
        """Revoke a user, forget the profiles they left for one-time links, withdraw the invitations
        of theirs nobody used, and tell every target to take their tunnels down.

        The revocation is kept for each target, in the same transaction, until that target
        confirms it (:class:`~app.services.agent.host_revocations.Revocations`): one that is down
        is told again, with backoff, until it answers. Until then the user may still end their
        own sessions and revoke their own devices at that target (:meth:`handle`). Calling it
        again for a revoked user tells the targets again at once.

        Raises:
            NotFound: no such user.
        """
        now = datetime.fromtimestamp(self._clock(), UTC)
        with self._store.unit() as uow:
            uow.users.revoke(user_id)
            user = uow.users.find(user_id)
            assert user is not None  # revoke raised NotFound otherwise
            uow.handoffs.forget_user(user_id)  # a link made before cannot hand their profile to anyone
            uow.invitations.withdraw_user(user_id, now)  # nor an invitation made before enrol them again
            for target in self.targets.values():
                uow.pending_revocations.add(target_id=target.name, user_id=user_id,
                                            sign_public_key=user.sign_public_key, now=now)
            uow.commit()
        results = self.revocations.revoked(user_id, user.sign_public_key)
        return {"user_id": user_id, "revoked": True, "targets": results}

    # -- a user's devices, for the administrator ---------------------------------------------

    def user_devices(self, user_id: str) -> dict[str, Any]:
        """``user_id``'s device enrolments at every target, as each target says (Host keeps none):
        ``devices`` (each with its ``target``: ticket, platform, state, reason, Objective-ID,
        enrolled, expires, ended), and ``unanswered``: the targets that could not be asked, and why.

        Raises:
            NotFound: no such user.
        """
        self._known(user_id)
        devices, unanswered = [], {}
        for target in self.targets.values():
            try:
                listed = self._ask_target(target, user_id, revoke=None)
            except (QossError, GatewayError, OSError) as exc:
                unanswered[target.name] = (exc.message if isinstance(exc, QossError) else "no answer")[:200]
                continue
            devices += [{"target": target.name, **d.as_dict()} for d in listed.devices]
        devices.sort(key=lambda d: -int(d["created"]))
        return {"user_id": user_id, "devices": devices, "unanswered": unanswered}

    def revoke_device(self, *, user_id: str, ticket: str) -> dict[str, Any]:
        """Revoke one of ``user_id``'s devices (its ticket) for the administrator: the target that
        holds it ends its live tunnel at once and unloads the conn that took only its certificate,
        so the device cannot join again; its enrolment is recorded ``revoked``.

        Raises:
            NotFound: no such user, or no target holds that ticket as an active device of theirs.
            GatewayError: a target that may hold it could not be asked (try again).
        """
        self._known(user_id)
        failed: list[str] = []
        for target in self.targets.values():
            try:
                listed = self._ask_target(target, user_id, revoke=ticket)
            except (QossError, GatewayError, OSError) as exc:
                failed.append(f"{target.name}: {exc.message if isinstance(exc, QossError) else 'no answer'}")
                continue
            if listed.revoked == ticket:
                return {"user_id": user_id, "ticket": ticket, "target": target.name, "revoked": True}
        if failed:
            raise GatewayError(f"not every target could be asked: {'; '.join(failed)}"[:300])
        raise NotFound(f"{user_id} has no active device {ticket} at any target")

    def _known(self, user_id: str) -> None:
        with self._store.unit() as uow:
            if uow.users.find(user_id) is None:
                raise NotFound(f"no user {user_id}")

    def _ask_target(self, target: _Target, user_id: str, *, revoke: str | None) -> UserDeviceList:
        """Ask ``target`` for ``user_id``'s devices (revoking ``revoke`` first): Host's question,
        signed and sealed to the target; the answer, signed by the target and sealed to Host, checked."""
        query = UserDevices(host=self.keys.name, target=target.name, nonce=secrets.token_bytes(16),
                            timestamp=int(self._clock()), user_id=user_id, revoke=revoke)
        if target.url == "local" and self._local is not None:
            return self._local.user_devices(query)[0]
        wire = self.keys.seal(kind=Kind.USER_DEVICES, to=target.name, body=query.body(), recipient=target.keys.kem,
                              recipient_mlkem=target.keys.mlkem)
        answer = self._post(f"{target.url}/v1/agent/target/requests", wire)
        kind, body, tag = self.keys.open_sealed(answer, kinds=[Kind.USER_DEVICE_LIST])
        self._crypto.verify(target.keys.sign, kind, body, tag)
        listed = UserDeviceList.parse(body)
        if (listed.target, listed.host, listed.user_id) != (target.name, self.keys.name, user_id) or (
                not secrets.compare_digest(listed.nonce, query.nonce)):
            raise AgentRejected("the target's answer is to another question")
        check_fresh(listed.timestamp, self._clock())
        return listed

    def retry_revocations(self) -> list[str]:
        """Send again the revocations a target has not confirmed whose next attempt is due
        (:meth:`Revocations.retry <app.services.agent.host_revocations.Revocations.retry>`);
        ``user@target`` of those confirmed now."""
        return self.revocations.retry()

    # -- requests -------------------------------------------------------------------------

    def handle(self, data: bytes, *, admit: Admit | None = None) -> Outcome:
        """Check a client's request, endorse it to its target and return the target's sealed answer.

        Args:
            data: the client's wire message.
            admit: called with the user id once the request is genuine, fresh and not a replay
                (the per-user rate limit); whatever it raises refuses the request, and the nonce
                is not spent, so the same request may be sent again later.

        Raises:
            AgentRejected: any check failed here or at the target (one public text for all).
            RemoteRefused: the target refused for another reason (e.g. 409: nothing feasible).
            GatewayError: the target (or its charon) is unreachable or failed.
            RateLimited: from ``admit``.
        """
        now = self._clock()
        steps = Steps("host")
        kind, body, tag = self.keys.open_sealed(data, kinds=[Kind.CONNECT, Kind.DISCONNECT, Kind.STATUS, Kind.DEVICES])
        request = ClientRequest.parse(body, kind=kind)
        if request.host != self.keys.name:
            raise AgentRejected("signed for another host")
        steps.mark("open")
        # One transaction: the user's record, every check, the nonce (a replay fails atomically).
        with self._store.request() as transaction:
            user = transaction.find_user(request.user_id)
            if user is None:
                raise AgentRejected(f"unknown user {request.user_id}")
            # A revoked user may still end their own sessions (and revoke their own devices) at a
            # target that has not confirmed the revocation yet: it only ever takes access away.
            if user.revoked and not (kind is Kind.DISCONNECT and transaction.revocation_pending(
                    user.user_id, request.request_info.target)):
                raise AgentRejected(f"revoked user {request.user_id}")
            self._crypto.verify(user.sign_public_key, kind, body, tag)
            check_fresh(request.timestamp, now)
            # A list of the user's own devices asks for no protection: any Objective-ID names it.
            if kind is not Kind.DEVICES and request.objective_id not in user.objectives:
                raise AgentRejected(f"objective {request.objective_id} not allowed for {user.user_id}")
            target = self.targets.get(request.request_info.target)
            if target is None:
                raise AgentRejected(f"unknown target {request.request_info.target}")
            if not transaction.claim_nonce("host", f"user:{user.user_id}", request.request_id,
                                           datetime.fromtimestamp(now + REPLAY_TTL, UTC)):
                raise AgentRejected("replayed request")
            granted = take_grant(transaction, user, platform=request.request_info.platform,
                                 min_levels=request.request_info.min_levels, now=now) \
                if kind is Kind.CONNECT else None
            if admit is not None:
                admit(user.user_id)
            transaction.commit()
        steps.mark("checks")
        if user.mlkem_public_key is not None and not sealed_hybrid(data):
            # A client that sealed to Host with X25519 alone (the browser's page) may not open a hybrid
            # answer: Target is given no ML-KEM key for it, so it answers X25519 alone and never with
            # a post-quantum preshared key.
            user = dataclasses.replace(user, mlkem_public_key=None)
        endorsement = Endorsement(
            kind=Kind.ENDORSE, host=self.keys.name, target=target.name, nonce=secrets.token_bytes(16),
            timestamp=int(self._clock()), user=user, client_kind=kind, client_body=body, client_tag=tag,
        )
        platform = request.request_info.platform
        what = (f"{'device' if platform else kind.value} user={user.user_id} objective={request.objective_id} "
                f"target={target.name}" + (f" platform={platform}" if platform else ""))
        try:
            if target.url == "local" and self._local is not None:
                # This process is the Target too: nothing to seal and sign to itself.
                outcome = self._local.handle_local(endorsement)
                answer, audit = outcome.answer, f"relayed {outcome.audit}"
            else:
                wire = self.keys.seal(kind=Kind.ENDORSE, to=target.name, body=endorsement.body(),
                                      recipient=target.keys.kem, recipient_mlkem=target.keys.mlkem)
                steps.mark("seal")
                answer, audit = self._post(f"{target.url}/v1/agent/target/requests", wire), f"relayed {what}"
        except AgentRejected as exc:
            if granted is not None:
                self.invitations.give_back(granted)
            raise AgentRejected(f"target rejected: {exc.reason}") from exc
        except Exception:
            if granted is not None:  # nothing was enrolled: the phone may try again
                self.invitations.give_back(granted)
            raise
        if granted is not None:
            audit = f"{audit} invitation={granted}"
        steps.mark("target")
        steps.done()
        return Outcome(answer=answer, audit=audit[:200])
