"""The agent's Target role (Liu et al. §2.2 steps 3-5): authorise, negotiate, configure charon, answer.

Target accepts only envelopes sealed to it and signed by a Host it trusts, which embed
the client's own signed request unchanged. It checks both signatures, the recipients,
both timestamps and both nonces (the replay cache is a unique row per nonce in the
database: atomic across workers, kept across restarts), then negotiates the suite from
the client's declared capabilities and minimums (its Objective-ID and Request Info),
Target's own policy and its charon's algorithms, creates a fresh 32-byte session key
(the IKE PSK for this client's identity only), and loads a one-address pool, the secret
and the conn into its charon. The answer is signed by Target and sealed to the client:
Host relays it and cannot read it.

Sessions expire (a sweeper removes conn, secret and pool, and releases the lease), end
when the client disconnects, and end when Host revokes the user. A new session's pool,
secret and conn are loaded while its row commits (reconcile leaves a conn being set up
alone); every other state change is committed before charon is touched. Whatever fails
(the commit, a load), what was loaded is unloaded, so a failure leaves nothing configured.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from app.adapters.agent.crypto import KeyPair, PublicKeys, open_sealed, seal, verify
from app.adapters.db.agent import (
    AgentSessionRow,
    LeaseRepository,
    NonceRepository,
    RevocationRepository,
    SessionRepository,
    add_session,
    claim_nonce,
    is_revoked,
    leased_addresses,
    take_lease,
)
from app.adapters.db.hot import HotCursor, HotTransaction, engine_of, hot_transaction
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.adapters.vici.driver import (
    Pipeline,
    ViciGateway,
    load_conn_command,
    load_pool_command,
    load_shared_command,
    unload_command,
)
from app.domain.agent import (
    AGENT_CONN_PREFIX,
    REPLAY_TTL,
    AgentRejected,
    AgentSessionState,
    ClientRequest,
    Endorsement,
    Kind,
    Response,
    Revocation,
    TunnelingInfo,
    agent_conn_name,
    check_fresh,
    target_conn,
)
from app.domain.errors import GatewayError, GatewayUnreachable
from app.domain.negotiation import NegotiationResult
from app.domain.tunnels import keywords_from_charon
from app.services.agent_config import AgentConfig, TargetRole
from app.services.agent_timing import Steps
from app.services.inputs import BackendIn, MinLevelsIn, NegotiationIn, PeerIn
from app.services.negotiation import run_negotiation
from app.services.ratings import TableCache

__all__ = ["RECONCILE_GRACE", "Outcome", "Reconciled", "TargetAgent"]

log = logging.getLogger("qoss.agent.target")

SessionFactory = Callable[[], Session]
ViciFactory = Callable[[str], ViciGateway]
_CAPS_TTL = 30.0
#: Reconcile leaves sessions younger than this alone (another worker may still be loading them).
RECONCILE_GRACE = 30.0


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a reconcile did: conns unloaded that no session owned; sessions ended whose conn vanished."""

    orphans: list[str]
    vanished: list[str]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What Target did with a message: the sealed answer and what the audit log should say."""

    answer: bytes
    audit: str


def _host_prefix(address: str) -> str:
    """A one-address pool: ``address/32`` (IPv4) or ``address/128`` (IPv6)."""
    return f"{address}/{32 if ':' not in address else 128}"


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class TargetAgent:
    """Target: turns endorsed client requests into configured tunnels in its charon."""

    def __init__(
        self, *, config: AgentConfig, keys: KeyPair, session_factory: SessionFactory, vici: ViciFactory,
        cache: TableCache, default_table: str, clock: Callable[[], float] = time.time,
    ) -> None:
        if config.target is None:
            raise ValueError("the config has no target role")
        self.role: TargetRole = config.target
        self.identity = config.target_identity
        self.keys = keys
        self.hosts: dict[str, PublicKeys] = {n: p.keys(config.base_dir) for n, p in self.role.hosts.items()}
        self._sessions = session_factory
        self._engine = engine_of(session_factory)  # admitting and recording a connect: a hot transaction
        self._vici = vici
        self._cache = cache
        self._default_table = default_table
        self._clock = clock
        self._caps: tuple[float, frozenset[str], str | None] | None = None
        self._caps_lock = threading.Lock()
        self._sweeps = 0
        #: Conns from the start of their load until their session is committed and loaded, or
        #: everything is undone (reconcile leaves them be).
        self._inflight: set[str] = set()
        self._inflight_lock = threading.Lock()
        #: Orphan conns the last reconcile saw: unloaded only if the next one sees them again.
        self._suspects: set[str] = set()
        #: The address :meth:`_lease` tries first (a hint only: the INSERT decides).
        self._lease_hint: str | None = None
        self._pool_network = ipaddress.ip_network(self.role.pool)

    # -- capabilities -------------------------------------------------------------------

    def _capabilities(self) -> tuple[frozenset[str], str | None]:
        with self._caps_lock:
            now = time.monotonic()
            if self._caps is None or now - self._caps[0] > _CAPS_TTL:
                v = self._vici(self.role.vici_socket)
                self._caps = (now, keywords_from_charon(v.get_algorithms().as_sections()), v.stats().backend)
            return self._caps[1], self._caps[2]

    # -- messages -------------------------------------------------------------------------

    def _open_endorsement(self, data: bytes, steps: Steps) -> Endorsement:
        """Open a sealed endorsement and check its Host's signature (the Host must be trusted)."""
        _, body, tag = open_sealed(data, kinds=[Kind.ENDORSE], me=self.keys)
        steps.mark("open")
        endorsement = Endorsement.parse(body)
        verify(self._host_keys(endorsement).sign, Kind.ENDORSE, body, tag)
        return endorsement

    def _host_keys(self, endorsement: Endorsement) -> PublicKeys:
        host_keys = self.hosts.get(endorsement.host)
        if host_keys is None:
            raise AgentRejected(f"unknown host {endorsement.host}")
        return host_keys

    def _check_endorsement(self, endorsement: Endorsement, now: float, steps: Steps) -> ClientRequest:
        """Everything but the envelope: addressed here, fresh, the client's own signed request,
        consistent with Host's word, an objective the user may ask for."""
        if endorsement.target != self.keys.name:
            raise AgentRejected("endorsement for another target")
        check_fresh(endorsement.timestamp, now)
        user = endorsement.user
        verify(user.sign_public_key, endorsement.client_kind, endorsement.client_body, endorsement.client_tag)
        request = ClientRequest.parse(endorsement.client_body, kind=endorsement.client_kind)
        if request.host != endorsement.host:
            raise AgentRejected("the client addressed another host")
        if request.user_id != user.user_id:
            raise AgentRejected("the endorsed user is not the requesting user")
        if request.request_info.target != self.keys.name:
            raise AgentRejected("the client asked for another target")
        check_fresh(request.timestamp, now)
        if request.objective_id not in user.objectives:
            raise AgentRejected(f"objective {request.objective_id} not allowed for {user.user_id}")
        steps.mark("verify")
        return request

    @staticmethod
    def _admit(cursor: HotCursor, endorsement: Endorsement, request: ClientRequest, now: float) -> None:
        """In the caller's transaction: Target's own revocation list, then both nonces (single use).

        Raises:
            AgentRejected: the user's key was revoked here, or a nonce was seen before.
        """
        if is_revoked(cursor, request.user_id, endorsement.user.sign_public_key):
            raise AgentRejected(f"user {request.user_id} was revoked (Target's own list)")
        expires = _at(now + REPLAY_TTL)
        if not claim_nonce(cursor, "target", f"host:{endorsement.host}", endorsement.nonce, expires):
            raise AgentRejected("replayed endorsement")
        if not claim_nonce(cursor, "target", f"user:{request.user_id}", request.request_id, expires):
            raise AgentRejected("replayed request")

    def handle(self, data: bytes) -> Outcome:
        """Answer one endorsed request (connect or disconnect): the sealed response for the client.

        Raises:
            AgentRejected: any check failed (nothing was configured).
            NoFeasibleSuite, UnsupportedProtection: nothing meets the minimums (nothing configured).
            GatewayError: charon failed or is unreachable (nothing left configured).
        """
        steps = Steps("target")
        return self._answer(self._open_endorsement(data, steps), steps)

    def handle_local(self, endorsement: Endorsement) -> Outcome:
        """:meth:`handle` for an endorsement from the Host role of this same process (``url: local``).

        Nothing crosses a network or a process boundary, so Host does not seal and sign it to
        itself; the Host must still be one this Target trusts, and every other check (freshness,
        the client's own signature, consistency, objectives, revocation, both nonces) is the same.
        """
        steps = Steps("target")
        self._host_keys(endorsement)
        return self._answer(endorsement, steps)

    def _answer(self, endorsement: Endorsement, steps: Steps) -> Outcome:
        now = self._clock()
        request = self._check_endorsement(endorsement, now, steps)
        if request.kind is Kind.DISCONNECT:
            ticket = request.request_info.ticket or ""
            with hot_transaction(self._engine) as cursor:
                self._admit(cursor, endorsement, request, now)
            self._close(ticket, user_id=request.user_id, state=AgentSessionState.CLOSED,
                        reason="disconnected by the client")
            response = Response(kind=Kind.CLOSED, request_id=request.request_id, session_key=None,
                                tunneling_info=None, target=self.keys.name, user_id=request.user_id,
                                host=endorsement.host, timestamp=int(self._clock()))
            answer = self._seal(response, endorsement)
            steps.mark("seal")
            audit = f"disconnect user={request.user_id} ticket={ticket}"
        else:
            session_key = secrets.token_bytes(32)

            def answer_with(info: TunnelingInfo) -> bytes:
                return self._seal(Response(
                    kind=Kind.RESPONSE, request_id=request.request_id, session_key=session_key,
                    tunneling_info=info, target=self.keys.name, user_id=request.user_id, host=endorsement.host,
                    timestamp=int(self._clock())), endorsement)

            info, answer = self._connect(endorsement, request, session_key, now, steps, answer_with)
            audit = (f"connect user={request.user_id} objective={request.objective_id} ticket={info.ticket} "
                     f"protection={info.protection} esp={info.esp_proposal}")
        steps.done()
        return Outcome(answer=answer, audit=audit[:200])

    def _seal(self, response: Response, endorsement: Endorsement) -> bytes:
        """The response signed by Target and sealed to the client (only the client can open it)."""
        return seal(kind=response.kind, to=response.user_id, body=response.body(), signer=self.keys,
                    recipient=endorsement.user.kem_public_key)

    # -- connect ------------------------------------------------------------------------

    def _negotiate(self, session: Session, request: ClientRequest,
                   capabilities: tuple[frozenset[str], str | None]) -> NegotiationResult:
        algorithms, backend = capabilities
        info = request.request_info
        libipsec = backend == "kernel-libipsec"
        peers = [
            PeerIn(name="client", objective_id=request.objective_id,
                   min_levels=MinLevelsIn(**dict(info.min_levels)),
                   supports=list(info.supports) if info.supports else None),
            # Target agrees to Native (Objective-ID 1) unless its own policy asks for protection.
            PeerIn(name="target", policy=self.role.policy, supports=sorted(algorithms),
                   objective_id=1 if request.objective_id == 1 else None),
        ]
        body = NegotiationIn(
            rating_table=self.role.rating_table, peers=peers,
            backend=BackendIn(name=backend or "strongswan", ah=info.ah and not libipsec, ah_esp_bundle=False,
                              transport=info.transport and not libipsec),
        )
        return run_negotiation(uow=SqlUnitOfWork(session), cache=self._cache, request=body,
                               default_table=self._default_table)

    def _connect(self, endorsement: Endorsement, request: ClientRequest, session_key: bytes, now: float,
                 steps: Steps, answer_with: Callable[[TunnelingInfo], bytes]) -> tuple[TunnelingInfo, bytes]:
        """Negotiate (reading only), then admit, lease and record the session in ONE hot
        transaction, and configure charon while that transaction commits; the tunneling info and
        the sealed answer
        (``answer_with(info)``, made while charon loads: it is returned only once the loads
        succeeded).

        The conn is in :attr:`_inflight` from before its load starts until after its session is
        committed and loaded (or everything is undone), so reconcile never takes it for an orphan.
        If the commit fails, the loads are waited for and unloaded (the lease and the session row
        were never committed); a failure while loading unloads everything loaded, ends the
        session as failed and frees its lease.
        """
        ticket = secrets.token_hex(16)
        conn = agent_conn_name(ticket)
        capabilities = self._capabilities()  # may ask charon: never while holding the transaction
        # Negotiation only reads (rating tables, a stored policy; normally from the cache, with no
        # query) in a Session of its own, before the write transaction; its refusal is raised only
        # once the request is admitted, so a replayed or revoked request is refused as such.
        refusal: Exception | None = None
        try:
            with self._sessions() as session:
                result = self._negotiate(session, request, capabilities)
        except Exception as exc:  # raised below, after the admission checks
            refusal = exc
        steps.mark("negotiate")
        transaction = HotTransaction(self._engine)
        try:
            try:
                self._admit(transaction.cursor, endorsement, request, now)
                steps.mark("admit")
                if refusal is not None:
                    raise refusal
                lifetime = min(request.request_info.lifetime, self.role.max_lifetime)
                expires = int(now) + lifetime
                suite = {**result.suite.as_dict(), "ike": dict(result.ike), "levels": result.levels.as_dict(),
                         "proposals": dict(result.proposals)}
                client_identity = f"{ticket[:12]}.{request.user_id}"
                base: dict[str, Any] = {
                    "ticket": ticket, "target_address": self.role.ike_address, "target_identity": self.identity,
                    "client_identity": client_identity, "remote_ts": tuple(self.role.protected),
                    "mode": result.mode, "suite": suite, "notes": tuple(n[:300] for n in result.notes[:16]),
                    "expires": expires,
                }
                if result.suite.protocol == "none":
                    # Objective-ID 1 (Native): no IPsec; nothing to configure, nothing to tear down.
                    transaction.commit()
                    info = TunnelingInfo(protection="native", ike_proposal=None, esp_proposal=None, **base)
                    answer = answer_with(info)
                    steps.mark("seal")
                    return info, answer
                esp, ike = result.proposals.get("esp"), result.proposals.get("ike")
                if esp is None or ike is None:
                    raise AgentRejected("the negotiated protection is not an ESP tunnel")  # AH is never chosen
            except BaseException as exc:
                transaction.abort(exc)
                raise
            # Admitted: charon loads secret and conn while the lease and the session are written,
            # the pool once its address is leased (a conn names its pool; charon looks it up only
            # when a client asks for an address), all while the transaction commits. The loads go
            # out pipelined on one connection; their replies are read at the end.
            with self._inflight_lock:
                self._inflight.add(conn)
            v = self._vici(self.role.vici_socket)
            loads, sent = v.pipeline(), []
            try:
                try:
                    # The pool goes with secret and conn, on the address the lease will most likely
                    # get (the hint); if the lease gets another, the pool is loaded again with it
                    # (charon replaces a pool no client has used yet).
                    hint = self._lease_hint
                    sent += ["shared", "conn", *(["pool"] if hint else [])]
                    loads.send([
                        load_shared_command(conn, session_key, [self.identity, client_identity]),
                        load_conn_command(conn, self._conn_body(conn, client_identity, request, ike, esp, result)),
                        *([load_pool_command(conn, _host_prefix(hint))] if hint else []),
                    ])
                    vip = self._lease(transaction.cursor, ticket)
                    if vip != hint:
                        sent.append("pool")
                        loads.send([load_pool_command(conn, _host_prefix(vip))])
                    add_session(transaction.cursor, AgentSessionRow(
                        ticket=ticket, user_id=request.user_id, host_id=endorsement.host,
                        request_id=request.request_id.hex(), objective_id=request.objective_id, protection="esp",
                        conn=conn, pool=conn, virtual_ip=vip, client_identity=client_identity, suite=suite,
                        state=AgentSessionState.ACTIVE.value, expires_at=_at(expires),
                    ))
                    transaction.commit()
                except BaseException as exc:
                    transaction.abort(exc)
                    self._finish_load(v, conn, loads, sent, undo=True)
                    raise
                steps.mark("commit")
                info = TunnelingInfo(protection="esp", ike_proposal=ike, esp_proposal=esp, **base)
                try:
                    try:
                        answer = answer_with(info)  # while charon loads
                        steps.mark("seal")
                    finally:
                        self._finish_load(v, conn, loads, sent)  # waited for even if sealing failed
                except BaseException as exc:
                    self._finish(ticket, AgentSessionState.FAILED,
                                 f"charon: {getattr(exc, 'message', type(exc).__name__)}")
                    raise
            finally:
                loads.close()
                with self._inflight_lock:
                    self._inflight.discard(conn)
        finally:
            transaction.close()
        steps.mark("load")
        return info, answer

    def _lease(self, cursor: HotCursor, ticket: str) -> str:
        """A free virtual IP from the pool, leased to ``ticket`` in the caller's transaction (a unique
        row: never handed out twice).

        The address after the last one leased here is tried first (one INSERT, no read of the
        lease table; it also leaves a just-released address to rest); if another session has it,
        the lease table is read and the first free address taken.
        """
        hint = self._lease_hint
        if hint is not None and take_lease(cursor, hint, ticket):
            self._lease_hint = self._after(hint)
            return hint
        taken = leased_addresses(cursor)
        for address in self._pool_network.hosts():
            text = str(address)
            if text not in taken and take_lease(cursor, text, ticket):
                self._lease_hint = self._after(text)
                return text
        raise AgentRejected("the virtual IP pool is exhausted")

    def _after(self, address: str) -> str | None:
        """The pool's next host address after ``address`` (None past the last)."""
        network = self._pool_network
        following = ipaddress.ip_address(address) + 1
        usable = following in network and (
            network.version == 6 or network.prefixlen >= 31 or following != network.broadcast_address)
        return str(following) if usable else None

    def _release(self, ticket: str) -> None:
        with self._sessions() as session, session.begin():
            LeaseRepository(session).release(ticket)

    def _conn_body(self, conn: str, client_identity: str, request: ClientRequest, ike: str, esp: str,
                   result: NegotiationResult) -> dict[str, Any]:
        """Target's side of the road warrior: the client's identity, the negotiated suite, the pool."""
        return target_conn(
            name=conn, target_address=self.role.ike_address, target_identity=self.identity,
            client_identity=client_identity, client_address=request.request_info.ike_address,
            local_ts=self.role.protected, pool=conn, ike_proposal=ike, esp_proposal=esp, mode=result.mode,
            ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"],
        )

    def _finish_load(self, v: ViciGateway, conn: str, loads: Pipeline, sent: Sequence[str], *,
                     undo: bool = False) -> None:
        """Read the loads' replies (``sent`` names what was sent, in order); if any load failed (or
        ``undo``), unload what may be loaded and raise the first error (with ``undo`` the caller
        has an error of its own to raise: a failed load is only logged). After a socket error
        any of the loads may have taken effect: all of them are unloaded."""
        try:
            replies = loads.finish()
        except GatewayError as exc:
            loaded, errors = list(sent), [exc]
        else:
            loaded = [w for w, reply in zip(sent, replies, strict=False) if not isinstance(reply, GatewayError)]
            errors = [reply for reply in replies if isinstance(reply, GatewayError)]
        loads.close()
        if errors or undo:
            self._unload(v, conn, loaded)
        if errors and undo:
            log.warning("loading %s failed while it was being undone: %s", conn,
                        getattr(errors[0], "message", type(errors[0]).__name__))
        elif errors:
            raise errors[0]

    @staticmethod
    def _unload(v: ViciGateway, conn: str, loaded: Sequence[str]) -> None:
        """Unload (one pipelined batch) what of conn, secret and pool is in ``loaded``."""
        what = [w for w in ("conn", "shared", "pool") if w in loaded]
        try:
            replies = v.batch([unload_command(w, conn) for w in what])
        except GatewayError as exc:
            log.warning("could not unload %s: %s", conn, exc.message)
            return
        for w, reply in zip(what, replies, strict=True):
            if isinstance(reply, GatewayError):
                log.warning("could not unload %s %s: %s", w, conn, reply.message)

    # -- teardown -------------------------------------------------------------------------

    def _finish(self, ticket: str, state: AgentSessionState, reason: str) -> AgentSessionRow | None:
        """Move the session out of ACTIVE (once), release its lease, take its config out of charon."""
        with self._sessions() as session, session.begin():
            sessions = SessionRepository(session)
            if not sessions.finish(ticket, state, reason):
                return None
            row = sessions.get(ticket)
            if row is not None:
                session.expunge(row)
        if row is not None and row.protection == "esp":
            self._teardown(row.conn)
        self._release(ticket)  # only once charon has let go of the address
        return row

    def _teardown(self, conn: str) -> None:
        v = self._vici(self.role.vici_socket)
        try:
            with contextlib.suppress(GatewayError):
                if v.list_sas(ike=conn):
                    v.terminate(ike=conn, timeout_ms=3000, force=True)
            self._unload(v, conn, ["pool", "shared", "conn"])
        except GatewayUnreachable as exc:
            # charon is gone, and with it everything it held; reconcile cleans up if it comes back.
            log.warning("teardown of %s: %s", conn, exc.message)

    def _close(self, ticket: str, *, user_id: str, state: AgentSessionState, reason: str) -> None:
        with self._sessions() as session:
            row = SessionRepository(session).get(ticket)
            owner = row.user_id if row is not None else None
            active = row is not None and row.state == AgentSessionState.ACTIVE.value
        if owner != user_id or not active:
            raise AgentRejected("ticket unknown, not this user's, or not active")
        if self._finish(ticket, state, reason) is None:
            raise AgentRejected("ticket used already")

    def revoke(self, data: bytes) -> Outcome:
        """Host revoked a user: record it in Target's own list (user and signing key, so a later
        endorsement of that key is refused whatever a Host says) and end that user's sessions
        (from that host). The answer is the count.

        Raises:
            AgentRejected: any check failed.
        """
        now = self._clock()
        _, body, tag = open_sealed(data, kinds=[Kind.REVOKE], me=self.keys)
        revocation = Revocation.parse(body)
        host_keys = self.hosts.get(revocation.host)
        if host_keys is None:
            raise AgentRejected(f"unknown host {revocation.host}")
        verify(host_keys.sign, Kind.REVOKE, body, tag)
        if revocation.target != self.keys.name:
            raise AgentRejected("revocation for another target")
        check_fresh(revocation.timestamp, now)
        with self._sessions() as session, session.begin():
            if not NonceRepository(session).claim("target", f"host:{revocation.host}", revocation.nonce,
                                                  _at(now + REPLAY_TTL)):
                raise AgentRejected("replayed revocation")
            RevocationRepository(session).add(user_id=revocation.user_id,
                                              sign_public_key=revocation.sign_public_key, host_id=revocation.host)
            tickets = [r.ticket for r in SessionRepository(session).select(
                state=AgentSessionState.ACTIVE, user_id=revocation.user_id) if r.host_id == revocation.host]
        closed = [t for t in tickets if self._finish(t, AgentSessionState.REVOKED, "user revoked at host")]
        return Outcome(answer=str(len(closed)).encode(),
                       audit=f"revoke user={revocation.user_id} closed={len(closed)}")

    def revocations(self, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Target's own revocation list, newest first (public keys only; at most ``limit``)."""
        with self._sessions() as session:
            return [{"user_id": r.user_id, "sign_public_key": r.sign_public_key, "host": r.host_id,
                     "revoked_at": r.revoked_at.isoformat()} for r in RevocationRepository(session).all(limit)]

    def sweep(self) -> list[str]:
        """End expired sessions, forget stale nonces, and (every 10th sweep, and the first) reconcile
        with charon. Returns the tickets ended because they expired."""
        now = self._clock()
        with self._sessions() as session, session.begin():
            expired = [r.ticket for r in SessionRepository(session).expired(_at(now))]
            NonceRepository(session).purge(_at(now))
        ended = [t for t in expired if self._finish(t, AgentSessionState.EXPIRED, "expired")]
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
          expires. Sessions still being set up (their conn loading or committing here, or, for a
          shared database, created in the last :data:`RECONCILE_GRACE` seconds) are left be.
        """
        v = self._vici(self.role.vici_socket)
        try:
            loaded = set(v.list_conns())
        except GatewayError as exc:
            log.warning("agent reconcile: %s", exc.message)
            return Reconciled(orphans=[], vanished=[])
        settled = _at(self._clock() - RECONCILE_GRACE)
        with self._inflight_lock:
            inflight = set(self._inflight)
        with self._sessions() as session:
            active = [(r.ticket, r.conn, r.created_at, r.protection)
                      for r in SessionRepository(session).select(state=AgentSessionState.ACTIVE, limit=100_000)]
        owned = {conn for _, conn, _, _ in active}
        unowned = {c for c in loaded if c.startswith(AGENT_CONN_PREFIX) and c not in owned and c not in inflight}
        orphans = sorted(unowned & self._suspects)
        self._suspects = unowned - self._suspects
        for conn in orphans:
            self._teardown(conn)
        vanished = [ticket for ticket, conn, created, protection in active
                    if protection == "esp" and conn not in loaded and conn not in inflight and created < settled]
        ended = [t for t in vanished
                 if self._finish(t, AgentSessionState.FAILED, "conn vanished from charon (restarted?)")]
        if orphans or ended:
            log.info("agent reconcile: %d orphaned conns unloaded, %d sessions whose conn vanished ended",
                     len(orphans), len(ended))
        return Reconciled(orphans=orphans, vanished=ended)

    def sessions(self, *, state: AgentSessionState | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Target's sessions, newest first (no key material: there is none stored)."""
        with self._sessions() as session:
            rows = SessionRepository(session).select(state=state, limit=limit)
            return [{
                "ticket": r.ticket, "user_id": r.user_id, "host": r.host_id, "objective_id": r.objective_id,
                "protection": r.protection, "conn": r.conn, "virtual_ip": r.virtual_ip, "state": r.state,
                "reason": r.reason, "suite": r.suite, "expires_at": r.expires_at.isoformat(),
                "created_at": r.created_at.isoformat(),
            } for r in rows]
