"""The tunnel agent's hot functions: one precompiled statement per call on the driver's cursor,
no ORM object on the path.

Target's and Host's hot transactions run them (:mod:`app.adapters.db.hot`); the repositories of
:mod:`app.adapters.db.agent` run them in their Session's transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, delete, exists, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from app.adapters.db import agent_rows
from app.adapters.db.hot import HotCursor, HotStatement, insert_new
from app.adapters.db.models import utcnow
from app.domain.agent import MLKEM_PUBLIC_BYTES, AgentSessionState, EnrolledUser, b64d, b64e
from app.domain.agent.ports import AgentSession, DeviceGrant
from app.domain.errors import AlreadyExists

__all__ = [
    "add_session",
    "claim_nonce",
    "device_grants",
    "enrolled_user",
    "find_user",
    "finish_session",
    "get_session",
    "held_sessions",
    "is_revoked",
    "leased_addresses",
    "release_leases",
    "revocation_pending",
    "spend_grant",
    "take_lease",
]


def enrolled_user(user_id: str, sign: str, kem: str, objectives: list[int], revoked_at: datetime | None,
                  mlkem: str | None) -> EnrolledUser:
    """A user as its row's columns hold it (keys in base64url), for the hot query and the repository alike."""
    return EnrolledUser(user_id=user_id, sign_public_key=b64d(sign, size=32), kem_public_key=b64d(kem, size=32),
                        objectives=frozenset(objectives), revoked=revoked_at is not None,
                        mlkem_public_key=b64d(mlkem, size=MLKEM_PUBLIC_BYTES) if mlkem is not None else None)


_USERS = cast(Table, agent_rows.AgentUserRow.__table__)
_FIND_USER = HotStatement(lambda _: select(
    _USERS.c.user_id, _USERS.c.sign_public_key, _USERS.c.kem_public_key, _USERS.c.objectives, _USERS.c.revoked_at,
    _USERS.c.mlkem_public_key,
).where(_USERS.c.user_id == bindparam("user_id")))


def find_user(cursor: HotCursor, user_id: str) -> EnrolledUser | None:
    """The user's record (one hot query: no ORM object on the path of every request)."""
    row = cursor.first(_FIND_USER, {"user_id": user_id})
    return None if row is None else enrolled_user(*row)


def claim_nonce(cursor: HotCursor, scope: str, sender: str, nonce: bytes, expires_at: datetime) -> bool:
    """Insert (scope, sender, nonce) into the replay cache; False if it is there already (a replay)."""
    return insert_new(cursor, agent_rows.AgentNonceRow,
                      {"scope": scope, "sender": sender, "nonce": nonce.hex(), "expires_at": expires_at})


_SESSIONS = cast(Table, agent_rows.AgentSessionRow.__table__)
_LEASES = cast(Table, agent_rows.AgentLeaseRow.__table__)
_ADD_SESSION = HotStatement(lambda _: insert(_SESSIONS))  # every column, each a bind of its own name


def add_session(cursor: HotCursor, row: AgentSession) -> None:
    """Insert a new session: one hot INSERT of every column (``updated_at``: its creation).

    Raises:
        AlreadyExists: the ticket exists (tickets are single-use). No savepoint: a clash of
            random 128-bit tickets fails the transaction.
    """
    values = {c.key: getattr(row, c.key) for c in _SESSIONS.columns}
    values["reason"] = values["reason"] or ""
    values["updated_at"] = values["updated_at"] or values["created_at"]
    try:
        cursor.execute(_ADD_SESSION, values)
    except IntegrityError as exc:
        raise AlreadyExists("ticket exists") from exc


_GET_SESSION = HotStatement(lambda _: select(*_SESSIONS.c).where(_SESSIONS.c.ticket == bindparam("ticket")))
_FINISH_SESSION = HotStatement(lambda _: update(_SESSIONS).where(  # no bind named as a column: see update()
    _SESSIONS.c.ticket == bindparam("which"), _SESSIONS.c.state == AgentSessionState.ACTIVE.value,
).values(state=bindparam("new_state"), reason=bindparam("new_reason"), updated_at=bindparam("now")))
_RELEASE_LEASES = HotStatement(lambda _: delete(_LEASES).where(_LEASES.c.ticket == bindparam("ticket")))


def get_session(cursor: HotCursor, ticket: str) -> AgentSession | None:
    """The session of ``ticket``, or None (one hot query)."""
    row = cursor.first(_GET_SESSION, {"ticket": ticket})
    return None if row is None else AgentSession(**dict(zip(_SESSIONS.c.keys(), row, strict=True)))


def finish_session(cursor: HotCursor, ticket: str, state: AgentSessionState, reason: str) -> bool:
    """Move an active session to ``state``; False if it was not active (single use)."""
    return cursor.execute(_FINISH_SESSION, {"which": ticket, "new_state": state.value,
                                            "new_reason": reason[:200], "now": utcnow()}) == 1


def release_leases(cursor: HotCursor, ticket: str) -> None:
    """Let go of the address leased to ``ticket`` (none: nothing happens)."""
    cursor.execute(_RELEASE_LEASES, {"ticket": ticket})


_REVOCATIONS = cast(Table, agent_rows.AgentRevocationRow.__table__)
_REVOKED = HotStatement(lambda _: select(exists().where(_REVOCATIONS.c.host_id == bindparam("host_id"),
                                                         _REVOCATIONS.c.user_id == bindparam("user_id"),
                                                         _REVOCATIONS.c.sign_public_key == bindparam("key"))))


def is_revoked(cursor: HotCursor, user_id: str, sign_public_key: bytes, host_id: str) -> bool:
    """Whether Target's revocation list has this user's signing key, revoked by ``host_id``."""
    row = cursor.first(_REVOKED, {"host_id": host_id, "user_id": user_id, "key": b64e(sign_public_key)})
    return bool(row and row[0])


_HELD = HotStatement(lambda _: select(func.count(_SESSIONS.c.platform), func.count()).select_from(_SESSIONS).where(
    _SESSIONS.c.host_id == bindparam("host_id"), _SESSIONS.c.user_id == bindparam("user_id"),
    _SESSIONS.c.state == AgentSessionState.ACTIVE.value, _SESSIONS.c.protection == "esp"))
#: PostgreSQL: a lock on one (Host, user) until the transaction ends; SQLite's write transaction
#: (``BEGIN IMMEDIATE``) holds every other writer off already.
_HOLD_USER = HotStatement(lambda dialect: select(
    func.pg_advisory_xact_lock(func.hashtext(bindparam("key"))) if dialect == "postgresql" else literal(1)))


def held_sessions(cursor: HotCursor, host_id: str, user_id: str) -> tuple[int, int]:
    """The addresses ``host_id``'s user ``user_id`` holds: (devices enrolled and not revoked,
    tunnels up), both active ESP sessions. The pair stays locked until the transaction ends, so two
    requests of one user count one after the other, on PostgreSQL as on SQLite."""
    cursor.first(_HOLD_USER, {"key": f"qoss-agent-user {host_id} {user_id}"})
    row = cursor.first(_HELD, {"host_id": host_id, "user_id": user_id})
    devices, sessions = (int(row[0]), int(row[1])) if row else (0, 0)
    return devices, sessions - devices


_PENDINGS = cast(Table, agent_rows.AgentPendingRevocationRow.__table__)
_PENDING = HotStatement(lambda _: select(exists().where(_PENDINGS.c.target_id == bindparam("target_id"),
                                                        _PENDINGS.c.user_id == bindparam("user_id"))))


def revocation_pending(cursor: HotCursor, user_id: str, target_id: str) -> bool:
    """Whether Host still waits for ``target_id`` to confirm the revocation of ``user_id``."""
    row = cursor.first(_PENDING, {"target_id": target_id, "user_id": user_id})
    return bool(row and row[0])


_LEASED = HotStatement(lambda _: select(_LEASES.c.address))


def leased_addresses(cursor: HotCursor) -> set[str]:
    """Every virtual IP leased now."""
    return {row[0] for row in cursor.all(_LEASED, {})}


def take_lease(cursor: HotCursor, address: str, ticket: str) -> bool:
    """Lease ``address`` to ``ticket``; False if someone else has it."""
    return insert_new(cursor, agent_rows.AgentLeaseRow, {"address": address, "ticket": ticket, "created_at": utcnow()})


_INVITATIONS = cast(Table, agent_rows.AgentInvitationRow.__table__)
_GRANTS = HotStatement(lambda _: select(
    _INVITATIONS.c.id, _INVITATIONS.c.platform, _INVITATIONS.c.minimums, _INVITATIONS.c.used_at,
    _INVITATIONS.c.grant_spent_at,
).where(_INVITATIONS.c.user_id == bindparam("user_id"), _INVITATIONS.c.sign_public_key == bindparam("key"))
    .order_by(_INVITATIONS.c.used_at))
_SPEND_GRANT = HotStatement(lambda _: update(_INVITATIONS).where(  # no bind named as a column: see update()
    _INVITATIONS.c.id == bindparam("which"), _INVITATIONS.c.used_at.is_not(None),
    _INVITATIONS.c.grant_spent_at.is_(None),
).values(grant_spent_at=bindparam("now")))


def device_grants(cursor: HotCursor, user_id: str, sign_public_key: bytes) -> list[DeviceGrant]:
    """The device enrolments invitations granted to this user's signing key (one hot query on the
    invitations of one user; none for keys of the user's own)."""
    return [DeviceGrant(invitation_id=r[0], platform=r[1], minimums=dict(r[2]), granted_at=r[3], spent_at=r[4])
            for r in cursor.all(_GRANTS, {"user_id": user_id, "key": b64e(sign_public_key)})]


def spend_grant(cursor: HotCursor, invitation_id: str, now: datetime) -> bool:
    """Use an invitation's device enrolment; False if it was used already."""
    return cursor.execute(_SPEND_GRANT, {"which": invitation_id, "now": now}) == 1
