"""Target's session bookkeeping: the virtual IPs leased from its pool, ending a session (once:
its lease released only once charon has let go of the address), expiry sweeps, and
reconciling the database with charon. A session's conn is *loading* from the start of its
load until its session is committed and loaded, or everything is undone; reconcile leaves
those alone."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.agent import AGENT_CONN_PREFIX, AgentRejected, AgentSessionState, PoolExhausted
from app.domain.agent.ports import AgentRequest, AgentSession, AgentStore
from app.domain.errors import GatewayError
from app.services.agent.target_charon import TargetCharon

__all__ = ["RECONCILE_GRACE", "Reconciled", "TargetSessions", "at"]

log = logging.getLogger("qoss.agent.target")

#: Reconcile leaves sessions younger than this alone (another worker may still be loading them).
RECONCILE_GRACE = 30.0


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a reconcile did: conns unloaded that no session owned; sessions ended whose conn vanished."""

    orphans: list[str]
    vanished: list[str]


def at(ts: float) -> datetime:
    """The UTC time of a POSIX timestamp."""
    return datetime.fromtimestamp(ts, UTC)


class TargetSessions:
    """The sessions of one Target: in its database (``store``) and its charon (``charon``)."""

    def __init__(self, *, store: AgentStore, charon: TargetCharon, pool: str, pool6: str | None = None,
                 clock: Callable[[], float] = time.time,
                 restore: Callable[[AgentSession], bool] | None = None) -> None:
        self._store = store
        #: Loads a device enrolment's conn again (its device holds a profile that must keep working);
        #: True when charon took it.
        self._restore = restore
        self._charon = charon
        self._clock = clock
        self._sweeps = 0
        #: Conns from the start of their load until their session is committed and loaded, or
        #: everything is undone (reconcile leaves them be).
        self._inflight: set[str] = set()
        self._inflight_lock = threading.Lock()
        #: Orphan conns the last reconcile saw: unloaded only if the next one sees them again.
        self._suspects: set[str] = set()
        #: The address :meth:`lease` tries first (a hint only: the INSERT decides).
        self._lease_hint: str | None = None
        self._pool_network = ipaddress.ip_network(pool)
        self._pool6_network = ipaddress.ip_network(pool6) if pool6 is not None else None
        #: How many addresses the pool hands out (its host addresses).
        self._pool_size = sum(1 for _ in self._pool_network.hosts())

    @contextlib.contextmanager
    def loading(self, conn: str) -> Iterator[None]:
        """``conn`` is being loaded while its session commits: reconcile takes it for no orphan."""
        with self._inflight_lock:
            self._inflight.add(conn)
        try:
            yield
        finally:
            with self._inflight_lock:
                self._inflight.discard(conn)

    # -- leases ---------------------------------------------------------------------------

    @property
    def lease_hint(self) -> str | None:
        """The address the next :meth:`lease` most likely gets (None: no guess)."""
        return self._lease_hint

    def lease(self, request: AgentRequest, ticket: str) -> str:
        """A free virtual IP from the pool, leased to ``ticket`` in the caller's transaction (a unique
        row: never handed out twice).

        The address after the last one leased here is tried first (one INSERT, no read of the
        lease table; it also leaves a just-released address to rest); if another session has it,
        the lease table is read and the first free address taken.

        Raises:
            PoolExhausted: every address of the pool is leased.
        """
        hint = self._lease_hint
        if hint is not None and request.take_lease(hint, ticket):
            self._lease_hint = self._after(hint)
            return hint
        taken = request.leased_addresses()
        for address in self._pool_network.hosts():
            text = str(address)
            if text not in taken and request.take_lease(text, ticket):
                self._lease_hint = self._after(text)
                return text
        raise PoolExhausted(f"every address of the virtual IP pool {self._pool_network} is leased")

    def companion(self, address: str) -> str | None:
        """The IPv6 address a client leasing ``address`` also gets from a dual pool: the one at the
        same offset in ``pool6`` (``10.3.8.5`` of ``10.3.8.0/24`` -> ``fd08::5`` of ``fd08::/120``);
        None without ``pool6``. Unique as the lease is: the lease of ``address`` holds both."""
        if self._pool6_network is None:
            return None
        offset = int(ipaddress.ip_address(address)) - int(self._pool_network.network_address)
        return str(self._pool6_network.network_address + offset)

    def _after(self, address: str) -> str | None:
        """The pool's next host address after ``address`` (None past the last)."""
        network = self._pool_network
        following = ipaddress.ip_address(address) + 1
        usable = following in network and (
            network.version == 6 or network.prefixlen >= 31 or following != network.broadcast_address)
        return str(following) if usable else None

    def _release(self, ticket: str) -> None:
        with self._store.request() as transaction:
            transaction.release_lease(ticket)
            transaction.commit()


    # -- ending ---------------------------------------------------------------------------

    def finish(self, ticket: str, state: AgentSessionState, reason: str) -> AgentSession | None:
        """Move the session out of ACTIVE (once), release its lease, take its config out of charon."""
        with self._store.unit() as uow:
            if not uow.sessions.finish(ticket, state, reason):
                return None
            row = uow.sessions.get(ticket)
            uow.commit()
        if row is not None:
            self.let_go(row)
        else:
            self._release(ticket)
        return row

    def let_go(self, row: AgentSession) -> None:
        """An ended session's conn out of charon, then its lease freed (no transaction held)."""
        if row.protection == "esp":  # a client's PPK has a secret of its own (a device's is its conn's)
            self._charon.teardown(row.conn, ppk=row.platform is None and "ppk" in row.suite)
        self._release(row.ticket)  # only once charon has let go of the address

    def close(self, transaction: AgentRequest, ticket: str, *, user_id: str, host_id: str) -> AgentSession:
        """The user ends their session, or revokes their device's enrolment (its live tunnel ends
        now and its certificate is accepted no more): ended in the message's own ``transaction``
        (committed here, refused or not: the message's nonces are used either way). The caller
        then lets go of the transaction and of the session (:meth:`let_go`).

        A user is ``host_id``'s: a ticket of another Host's user of the same id is not theirs.

        Raises:
            AgentRejected: the ticket is unknown, not this user's or not active.
        """
        row = transaction.session(ticket)
        if (row is None or row.user_id != user_id or row.host_id != host_id
                or row.state != AgentSessionState.ACTIVE.value):
            transaction.commit()
            raise AgentRejected("ticket unknown, not this user's, or not active")
        if row.platform is not None:
            state, reason = AgentSessionState.REVOKED, "device revoked by its user"
        else:
            state, reason = AgentSessionState.CLOSED, "disconnected by the client"
        ended = transaction.finish_session(ticket, state, reason)  # another process may have ended it
        transaction.commit()
        if not ended:
            raise AgentRejected("ticket used already")
        return row


    def sweep(self) -> list[str]:
        """End expired sessions, forget stale nonces, and (every 10th sweep, and the first) reconcile
        with charon. Returns the tickets ended because they expired."""
        now = self._clock()
        with self._store.unit() as uow:
            expired = [r.ticket for r in uow.sessions.expired(at(now))]
            uow.nonces.purge(at(now))
            uow.commit()
        ended = [t for t in expired if self.finish(t, AgentSessionState.EXPIRED, "expired")]
        if self._sweeps % 10 == 0:
            self.reconcile()
        self._sweeps += 1
        return ended

    def reconcile(self) -> Reconciled:
        """Make the database and charon agree about agent conns.

        * A ``qoss-agent-*`` conn that no active session owns, here and in the previous reconcile,
          is unloaded (with its secret and pool). Two passes because Target loads a conn while its
          session's transaction commits: another process sharing this charon and database may
          be between the two (this process's own conns in flight are known and never suspects).
        * An active session whose conn is not in charon (charon restarted, or someone unloaded it)
          is ended as ``failed`` and its lease freed, instead of staying ``active`` until it
          expires; a device enrolment's conn is loaded again instead (ended only if that fails).
          Sessions still being set up (their conn loading or committing here, or, for a
          shared database, created in the last :data:`RECONCILE_GRACE` seconds) are left be.
        """
        v = self._charon.gateway()
        try:
            loaded = set(v.list_conns())
        except GatewayError as exc:
            log.warning("agent reconcile: %s", exc.message)
            return Reconciled(orphans=[], vanished=[])
        settled = at(self._clock() - RECONCILE_GRACE)
        with self._inflight_lock:
            inflight = set(self._inflight)
        with self._store.unit() as uow:
            rows = uow.sessions.select(state=AgentSessionState.ACTIVE, limit=100_000)
        active = [(r.ticket, r.conn, r.created_at, r.protection) for r in rows]
        devices = {r.ticket: r for r in rows if r.platform is not None}
        owned = {conn for _, conn, _, _ in active}
        unowned = {c for c in loaded if c.startswith(AGENT_CONN_PREFIX) and c not in owned and c not in inflight}
        orphans = sorted(unowned & self._suspects)
        self._suspects = unowned - self._suspects
        for conn in orphans:
            self._charon.teardown(conn)
        missing = [ticket for ticket, conn, created, protection in active
                   if protection == "esp" and conn not in loaded and conn not in inflight and created < settled]
        # A device keeps its profile for days: its conn is loaded again rather than the enrolment ended.
        vanished = [t for t in missing
                    if t not in devices or self._restore is None or not self._restore(devices[t])]
        ended = [t for t in vanished
                 if self.finish(t, AgentSessionState.FAILED, "conn vanished from charon (restarted?)")]
        if orphans or ended:
            log.info("agent reconcile: %d orphaned conns unloaded, %d sessions whose conn vanished ended",
                     len(orphans), len(ended))
        return Reconciled(orphans=orphans, vanished=ended)

    def usage(self, *, top: int = 20) -> dict[str, Any]:
        """The pool's size and how much of it is leased, and the ``top`` (Host, user) pairs holding
        the most addresses, with how many of those are devices' (held for a certificate's life)
        and how many tunnels'."""
        with self._store.unit() as uow:
            leased = len(uow.leases.taken())
            rows = uow.sessions.select(state=AgentSessionState.ACTIVE, limit=100_000)
        held: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            if r.virtual_ip is not None:
                counts = held.setdefault((r.host_id, r.user_id), [0, 0])
                counts[0 if r.platform is not None else 1] += 1
        ranked = sorted(held.items(), key=lambda item: (-sum(item[1]), item[0]))[:top]
        return {"pool": str(self._pool_network),
                "pool6": str(self._pool6_network) if self._pool6_network is not None else None,
                "size": self._pool_size, "leased": leased, "free": max(self._pool_size - leased, 0),
                "holders": [{"host": host, "user_id": user, "devices": devices, "tunnels": tunnels}
                            for (host, user), (devices, tunnels) in ranked]}

    def listing(self, *, state: AgentSessionState | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Target's sessions, newest first, without key material (a device's PPK, kept sealed, is named by its id)."""
        with self._store.unit() as uow:
            rows = uow.sessions.select(state=state, limit=limit)
            return [{
                "ticket": r.ticket, "user_id": r.user_id, "host": r.host_id, "objective_id": r.objective_id,
                "protection": r.protection, "conn": r.conn, "virtual_ip": r.virtual_ip, "state": r.state,
                "reason": r.reason, "suite": _shown(r.suite), "expires_at": r.expires_at.isoformat(),
                "created_at": r.created_at.isoformat(), "platform": r.platform,
            } for r in rows]


def _shown(suite: dict[str, Any]) -> dict[str, Any]:
    """A session's suite as listed: a device's PPK by its id alone (its sealed key stays in the store)."""
    if "ppk" not in suite:
        return suite
    return {**suite, "ppk": {"id": (suite["ppk"] or {}).get("id")}}
