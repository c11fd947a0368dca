"""What Target's charon loads for one session, whoever it is for (a client's agent or a device):
the session's one-address pools (its virtual IP's, and on a dual-pool Target the IPv6
companion's), a client's conn (the road warrior's Target side), and a fresh post-quantum
preshared key."""

from __future__ import annotations

import secrets
from typing import Any

from app.domain.agent import ClientRequest, target_conn
from app.domain.agent.conns import pool6_name
from app.domain.charon_port import CharonCommand, LoadPool
from app.domain.negotiation import NegotiationResult
from app.services.agent.config import TargetRole
from app.services.agent.target_charon import host_prefix
from app.services.agent.target_sessions import TargetSessions

__all__ = ["SessionLoads", "fresh_ppk"]


def fresh_ppk() -> tuple[str, bytes]:
    """A new post-quantum preshared key: a random id (``qoss-ppk-`` and 24 hex digits) and 32
    random bytes (RFC 8784 asks for at least 256 bits of entropy)."""
    return f"qoss-ppk-{secrets.token_hex(12)}", secrets.token_bytes(32)


class SessionLoads:
    """The loads of one Target's sessions.

    Args:
        role: Target's configuration (its address, the networks it protects, its pools).
        identity: Target's IKE identity.
        book: its sessions' bookkeeping (which IPv6 address goes with a leased one).
    """

    def __init__(self, *, role: TargetRole, identity: str, book: TargetSessions) -> None:
        self._role = role
        self._identity = identity
        self._book = book

    def pool6(self, conn: str) -> str | None:
        """The name of ``conn``'s IPv6 pool on a dual-pool Target (None: the Target has one pool)."""
        return pool6_name(conn) if self._role.pool6 is not None else None

    def pools(self, conn: str, vip: str) -> tuple[list[str], list[CharonCommand]]:
        """The one-address pools of a session leasing ``vip`` (what :meth:`TargetCharon.finish_load
        <app.services.agent.target_charon.TargetCharon.finish_load>` names them, and their loads):
        ``vip``'s, named ``conn``, and on a dual-pool Target its IPv6 companion's
        (:meth:`TargetSessions.companion <app.services.agent.target_sessions.TargetSessions.companion>`)."""
        companion = self._book.companion(vip)
        if companion is None:
            return ["pool"], [LoadPool(conn, host_prefix(vip))]
        return ["pool", "pool6"], [LoadPool(conn, host_prefix(vip)), LoadPool(pool6_name(conn), host_prefix(companion))]

    def client_conn(self, conn: str, client_identity: str, request: ClientRequest, ike: str, esp: str,
                    result: NegotiationResult, ppk_id: str | None = None) -> dict[str, Any]:
        """Target's side of the road warrior: the client's identity, the negotiated suite, the pool
        (and the PPK it requires, by its id)."""
        role = self._role
        return target_conn(
            name=conn, target_address=role.ike_address, target_identity=self._identity,
            client_identity=client_identity, client_address=request.request_info.ike_address,
            local_ts=role.protected, pool=conn, ike_proposal=ike, esp_proposal=esp, mode=result.mode,
            ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"], pool6=self.pool6(conn),
            ppk_id=ppk_id,
        )
