"""The agent's Target role (Liu et al. §2.2 steps 3-5): authorise, negotiate, configure charon, answer.

Target answers what a Host it trusts endorsed: a client's connect, disconnect, status and the
list of the user's devices, a Host's own question about a user's devices, and a Host's
revocation of a user. What it admits (both signatures, the recipients, both timestamps and
both nonces) is :mod:`~app.services.agent.target_admission`'s to decide. A connect negotiates
the suite from the client's declared capabilities and minimums (its Objective-ID and Request
Info), Target's own policy and its charon's algorithms, creates a fresh 32-byte session key
(the IKE PSK for this client's identity only), and loads a one-address pool, the secret and
the conn into its charon (:mod:`~app.services.agent.target_loads`); a device's connect gets a
certificate and a profile instead (:mod:`~app.services.agent.target_devices`). The answer is
signed by Target and sealed to the client: Host relays it and cannot read it.

Sessions expire (a sweeper removes conn, secret and pool, and releases the lease), end
when the client disconnects, and end when Host revokes the user. A new session's pool,
secret and conn are loaded while its row commits (reconcile leaves a conn being set up
alone); every other state change is committed before charon is touched. Whatever fails
(the commit, a load), what was loaded is unloaded, so a failure leaves nothing configured.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.domain.agent import (
    REPLAY_TTL,
    AgentRejected,
    AgentSessionState,
    ClientRequest,
    DeviceBundle,
    DeviceQuotaExceeded,
    Endorsement,
    Kind,
    NoPostQuantumKey,
    Response,
    Revocation,
    SessionStatus,
    TunnelingInfo,
    TunnelQuotaExceeded,
    agent_conn_name,
    check_fresh,
    device_identity,
)
from app.domain.agent.conns import ppk_name
from app.domain.agent.messages import UserDeviceList, UserDevices
from app.domain.agent.platforms import LABELS, post_quantum_refusal
from app.domain.agent.ports import (
    AgentCrypto,
    AgentKeys,
    AgentRequest,
    AgentSession,
    AgentStore,
    DeviceKit,
    IssuedDevice,
    PeerKeys,
)
from app.domain.charon_port import CharonCommand, LoadConn, LoadShared, ViciFactory
from app.domain.errors import NoFeasibleSuite, PlatformCannot
from app.domain.negotiation import NegotiationResult
from app.domain.ports import UnitOfWorkFactory
from app.services.agent.config import AgentConfig, TargetRole
from app.services.agent.target_admission import TargetAdmission
from app.services.agent.target_charon import TargetCharon
from app.services.agent.target_devices import TargetDevices, devices_of
from app.services.agent.target_edits import SessionFollower, negotiate_session, session_inputs, session_provenance
from app.services.agent.target_loads import SessionLoads, fresh_ppk
from app.services.agent.target_sessions import Reconciled, TargetSessions, at
from app.services.agent.timing import Steps

__all__ = ["Outcome", "TargetAgent"]

log = logging.getLogger("qoss.agent.target")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What Target did with a message: the sealed answer and what the audit log should say."""

    answer: bytes
    audit: str


class TargetAgent:
    """Target: turns endorsed client requests into configured tunnels in its charon.

    What it admits is decided by a :class:`~app.services.agent.target_admission.TargetAdmission`;
    its charon is a :class:`~app.services.agent.target_charon.TargetCharon`, what it loads there
    for a session a :class:`~app.services.agent.target_loads.SessionLoads`, its sessions'
    bookkeeping (leases, ending, sweeps, reconcile) a
    :class:`~app.services.agent.target_sessions.TargetSessions`, and its devices' enrolment a
    :class:`~app.services.agent.target_devices.TargetDevices`.

    Args:
        keys: Target's own keys; ``crypto`` checks signatures and reads the Hosts' public keys.
        store: the agent's state (a message's checks and records: one request transaction);
            ``units``: the negotiation's reads (rating tables, policies).
        vici: Target's charon by its socket path.
        devices: Target's CA for devices and its profile writers (None: it enrols no devices).
    """

    def __init__(
        self, *, config: AgentConfig, keys: AgentKeys, crypto: AgentCrypto, store: AgentStore,
        units: UnitOfWorkFactory, vici: ViciFactory, default_table: str,
        clock: Callable[[], float] = time.time, devices: DeviceKit | None = None,
    ) -> None:
        if config.target is None:
            raise ValueError("the config has no target role")
        self.role: TargetRole = config.target
        self.identity = config.target_identity
        self.keys = keys
        self._crypto = crypto
        self.hosts: dict[str, PeerKeys] = {n: p.keys(config.base_dir, crypto) for n, p in self.role.hosts.items()}
        self._store = store
        self._units = units
        self._default_table = default_table
        self._clock = clock
        self._charon = TargetCharon(vici=vici, socket=self.role.vici_socket, dual_pool=self.role.pool6 is not None)
        self._book = TargetSessions(store=store, charon=self._charon, pool=self.role.pool, pool6=self.role.pool6,
                                    clock=clock, restore=self._restore_device if devices is not None else None)
        self._admission = TargetAdmission(name=keys.name, hosts=self.hosts, crypto=crypto)
        self._loads = SessionLoads(role=self.role, identity=self.identity, book=self._book)
        self._devices = TargetDevices(kit=devices, role=self.role, identity=self.identity, charon=self._charon,
                                      loads=self._loads)

    def _restore_device(self, session: AgentSession) -> bool:
        """Load an enrolled device's conn and pool again (charon restarted): True if charon took them
        (:meth:`TargetDevices.restore <app.services.agent.target_devices.TargetDevices.restore>`)."""
        return self._devices.restore(session)

    # -- messages -------------------------------------------------------------------------

    def handle(self, data: bytes) -> Outcome:
        """Answer one endorsed request (connect, disconnect, status, the user's devices): the sealed
        response for the client; or a Host's own question about a user's devices
        (:meth:`user_devices`): the sealed answer for that Host.

        Raises:
            AgentRejected: any check failed (nothing was configured).
            NoFeasibleSuite, UnsupportedProtection: nothing meets the minimums (nothing configured).
            GatewayError: charon failed or is unreachable (nothing left configured).
        """
        steps = Steps("target")
        kind, body, tag = self.keys.open_sealed(data, kinds=[Kind.ENDORSE, Kind.USER_DEVICES])
        steps.mark("open")
        if kind is Kind.USER_DEVICES:
            query = UserDevices.parse(body)
            self._crypto.verify(self._admission.host_keys(query.host).sign, Kind.USER_DEVICES, body, tag)
            answer, audit = self.user_devices(query)
            wire = self.keys.seal(kind=Kind.USER_DEVICE_LIST, to=answer.host, body=answer.body(),
                                  recipient=self.hosts[answer.host].kem, recipient_mlkem=self.hosts[answer.host].mlkem)
            return Outcome(answer=wire, audit=audit)
        return self._answer(self._admission.open_endorsement(kind, body, tag), steps)

    def handle_local(self, endorsement: Endorsement) -> Outcome:
        """:meth:`handle` for an endorsement from the Host role of this same process (``url: local``).

        Nothing crosses a network or a process boundary, so Host does not seal and sign it to
        itself; the Host must still be one this Target trusts, and every other check (freshness,
        the client's own signature, consistency, objectives, revocation, both nonces) is the same.
        """
        steps = Steps("target")
        self._admission.host_keys(endorsement.host)
        return self._answer(endorsement, steps)

    def _answer(self, endorsement: Endorsement, steps: Steps) -> Outcome:
        now = self._clock()
        request = self._admission.check(endorsement, now, steps)
        if request.kind is Kind.DISCONNECT:
            ticket = request.request_info.ticket or ""
            with self._store.request() as transaction:
                self._admission.admit(transaction, endorsement, request, now)
                ended = self._book.close(transaction, ticket, user_id=request.user_id, host_id=endorsement.host)
            self._book.let_go(ended)  # charon's work, with no connection held
            response = Response(kind=Kind.CLOSED, request_id=request.request_id, session_key=None,
                                tunneling_info=None, target=self.keys.name, user_id=request.user_id,
                                host=endorsement.host, timestamp=int(self._clock()))
            answer = self._seal(response, endorsement)
            steps.mark("seal")
            audit = (f"{'revoke-device' if ended.platform else 'disconnect'} user={request.user_id} "
                     f"ticket={ticket}")
        elif request.kind is Kind.STATUS:
            ticket = request.request_info.ticket or ""
            with self._store.request() as transaction:
                self._admission.admit(transaction, endorsement, request, now)
                row = transaction.session(ticket)
                transaction.commit()
            if row is None or row.user_id != request.user_id or row.host_id != endorsement.host:
                raise AgentRejected("ticket unknown or not this user's")  # a user is their own Host's
            status = SessionStatus(ticket=ticket, state=AgentSessionState(row.state), reason=row.reason[:500],
                                   platform=row.platform)
            answer = self._seal(Response(
                kind=Kind.STATE, request_id=request.request_id, session_key=None, tunneling_info=None,
                target=self.keys.name, user_id=request.user_id, host=endorsement.host,
                timestamp=int(self._clock()), status=status), endorsement)
            steps.mark("seal")
            audit = f"status user={request.user_id} ticket={ticket} state={row.state}"
        elif request.kind is Kind.DEVICES:
            with self._store.request() as transaction:
                self._admission.admit(transaction, endorsement, request, now)
                transaction.commit()
            devices = devices_of(self._store, user_id=request.user_id, host_id=endorsement.host)
            answer = self._seal(Response(
                kind=Kind.DEVICE_LIST, request_id=request.request_id, session_key=None, tunneling_info=None,
                target=self.keys.name, user_id=request.user_id, host=endorsement.host,
                timestamp=int(self._clock()), devices=devices), endorsement)
            steps.mark("seal")
            audit = f"devices user={request.user_id} listed={len(devices)}"
        else:
            platform = request.request_info.platform
            session_key = secrets.token_bytes(32) if platform is None else None

            def answer_with(info: TunnelingInfo, device: DeviceBundle | None = None, ppk: bytes | None = None) -> bytes:
                # A PPK, the client's or in a device's profile, is sealed hybrid or not at all.
                return self._seal(Response(
                    kind=Kind.RESPONSE, request_id=request.request_id, session_key=session_key,
                    tunneling_info=info, target=self.keys.name, user_id=request.user_id, host=endorsement.host,
                    timestamp=int(self._clock()), device=device, ppk=ppk), endorsement,
                    post_quantum=ppk is not None or (device is not None and info.suite.get("post_quantum") is not None))

            info, answer = self._connect(endorsement, request, session_key, now, steps, answer_with)
            audit = (f"{'device' if platform else 'connect'} user={request.user_id} "
                     f"objective={request.objective_id} ticket={info.ticket} "
                     + (f"platform={platform} " if platform else "")
                     + f"protection={info.protection} esp={info.esp_proposal}")
        steps.done()
        return Outcome(answer=answer, audit=audit[:200])

    def _seal(self, response: Response, endorsement: Endorsement, *, post_quantum: bool = False) -> bytes:
        """The response signed by Target and sealed to the client (only the client can open it);
        ``post_quantum``: it carries a PPK, so it is sealed hybrid or not at all."""
        return self.keys.seal(kind=response.kind, to=response.user_id, body=response.body(),
                              recipient=endorsement.user.kem_public_key,
                              recipient_mlkem=endorsement.user.mlkem_public_key, post_quantum=post_quantum)

    # -- connect ------------------------------------------------------------------------

    def _connect(self, endorsement: Endorsement, request: ClientRequest, session_key: bytes | None, now: float,
                 steps: Steps, answer_with: Callable[..., bytes]) -> tuple[TunnelingInfo, bytes]:
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
        capabilities = self._charon.capabilities()  # may ask charon: never while holding the transaction
        # Negotiation only reads (rating tables, a stored policy; normally from the cache, with no
        # query) in a unit of work of its own, before the write transaction; its refusal is raised
        # only once the request is admitted, so a replayed or revoked request is refused as such.
        refusal: Exception | None = None
        platform = request.request_info.platform
        inputs = session_inputs(request, policy=self.role.policy, rating_table=self.role.rating_table,
                                capabilities=capabilities)
        try:
            if platform is not None:
                self._devices.check_platform(platform, request.objective_id,
                                             int(request.request_info.min_levels.get("post_quantum", 0)))
            with self._units() as uow:
                result = self._negotiate(uow, inputs)
                origin = (session_provenance(uow=uow, inputs=inputs, result=result)
                          if result.suite.protocol != "none" else None)
        except Exception as exc:  # raised below, after the admission checks
            refusal = exc
        steps.mark("negotiate")
        # Leaving it on an error rolls back what was not (and drops a connection the error showed dead).
        with self._store.request() as transaction:
            self._admission.admit(transaction, endorsement, request, now)
            steps.mark("admit")
            if refusal is not None:
                raise refusal
            if result.suite.protocol != "none":  # a native session holds no address
                self._check_quota(transaction, endorsement.host, request.user_id, device=platform is not None)
            lifetime = (self.role.device_lifetime if platform is not None
                        else min(request.request_info.lifetime, self.role.max_lifetime))
            expires = int(now) + lifetime
            suite = {**result.suite.as_dict(), "ike": dict(result.ike), "levels": result.levels.as_dict(),
                     "proposals": dict(result.proposals),
                     # a device's conn is loaded again from these if charon restarts
                     **({"mode": result.mode, "lifetimes": dict(result.lifetimes)} if platform is not None else {})}
            client_identity = (device_identity(ticket, request.user_id) if platform is not None
                               else f"{ticket[:12]}.{request.user_id}")
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
            device: IssuedDevice | None = None
            stored_suite = suite
            client_ppk: tuple[str, bytes] | None = None
            if platform is None:
                assert session_key is not None
                if result.suite.post_quantum == "ppk":
                    # The client's charon gets it in the answer, beside the session key; it is not
                    # kept (a client's session is not loaded again after a restart).
                    if endorsement.user.mlkem_public_key is None:
                        raise NoPostQuantumKey(f"user {request.user_id}")
                    client_ppk = fresh_ppk()
                    stored_suite = {**suite, "ppk": {"id": client_ppk[0]}}
                ppk_loads: list[CharonCommand] = [] if client_ppk is None else [
                    LoadShared(ppk_name(conn), client_ppk[1], (client_ppk[0],), "PPK")]
                first: list[CharonCommand] = [
                    LoadShared(conn, session_key, (self.identity, client_identity)), *ppk_loads,
                    LoadConn(conn, self._loads.client_conn(conn, client_identity, request, ike, esp, result,
                                                           client_ppk[0] if client_ppk is not None else None))]
                first_sent = ["shared", *(["ppk"] if client_ppk is not None else []), "conn"]
            else:
                # A device: its certificate, key and profile are made before charon is touched (a
                # platform that cannot express the suite is refused with nothing loaded).
                ppk = self._devices.new_ppk(ticket, platform, result)
                if ppk is not None and endorsement.user.mlkem_public_key is None:
                    # The answer carries the PPK in the profile: sealed hybrid or not at all.
                    raise NoPostQuantumKey(f"user {request.user_id}")
                if ppk is not None:  # kept sealed with the session, to load it again if charon restarts
                    stored_suite = {**suite, "ppk": {"id": ppk[0], "sealed": ppk[2]}}
                device, first = self._devices.issue(conn, platform, client_identity, ike, esp, result, lifetime,
                                                    ppk[:2] if ppk is not None else None)
                first_sent = ["cert", "key", *(["shared"] if ppk is not None else []), "conn"]
            # Admitted: charon loads secret and conn while the lease and the session are written,
            # the pool once its address is leased (a conn names its pool; charon looks it up only
            # when a client asks for an address), all while the transaction commits. The loads go
            # out pipelined on one connection; their replies are read at the end.
            with self._book.loading(conn):
                v = self._charon.gateway()
                loads, sent = v.pipeline(), []
                try:
                    try:
                        # The pool goes with secret and conn, on the address the lease will most likely
                        # get (the hint); if the lease gets another, the pool is loaded again with it
                        # (charon replaces a pool no client has used yet).
                        hint = self._book.lease_hint
                        kinds, pools = self._loads.pools(conn, hint) if hint else ([], [])
                        sent += [*first_sent, *kinds]
                        loads.send([*first, *pools])
                        vip = self._book.lease(transaction, ticket)
                        if vip != hint:
                            kinds, pools = self._loads.pools(conn, vip)
                            sent += kinds
                            loads.send(pools)
                        transaction.add_session(AgentSession(
                            ticket=ticket, user_id=request.user_id, host_id=endorsement.host,
                            request_id=request.request_id.hex(), objective_id=request.objective_id,
                            protection="esp",
                            conn=conn, pool=conn, virtual_ip=vip, client_identity=client_identity, suite=stored_suite,
                            state=AgentSessionState.ACTIVE.value, expires_at=at(expires), provenance=origin,
                            platform=platform,
                        ))
                        transaction.commit()
                    except BaseException:
                        transaction.rollback()  # the database first: charon may take a while
                        self._charon.finish_load(v, conn, loads, sent, undo=True)
                        raise
                    steps.mark("commit")
                    info = TunnelingInfo(protection="esp", ike_proposal=ike, esp_proposal=esp,
                                         ppk_id=client_ppk[0] if client_ppk is not None else None, **base)
                    try:
                        try:
                            answer = answer_with(info, self._devices.bundle(platform, device),  # while charon loads
                                                 client_ppk[1] if client_ppk is not None else None)
                            steps.mark("seal")
                        finally:
                            self._charon.finish_load(v, conn, loads, sent)  # waited for even if sealing failed
                    except BaseException as exc:
                        self._book.finish(ticket, AgentSessionState.FAILED,
                                          f"charon: {getattr(exc, 'message', type(exc).__name__)}")
                        raise
                finally:
                    loads.close()
        steps.mark("load")
        return info, answer

    def _negotiate(self, uow: Any, inputs: dict[str, Any]) -> NegotiationResult:
        """The session's negotiation; for a device whose platform is what leaves nothing feasible,
        a refusal naming the platform and what it lacks."""
        try:
            return negotiate_session(uow=uow, inputs=inputs, default_table=self._default_table)
        except NoFeasibleSuite as exc:
            platform = inputs.get("platform")
            if not platform:
                raise
            try:  # would the others agree without the platform's table?
                negotiate_session(uow=uow, default_table=self._default_table,
                                  inputs={k: v for k, v in inputs.items() if k != "platform"})
            except NoFeasibleSuite:
                raise exc from None
            for unmet in exc.unmet:  # a post-quantum minimum (e.g. Target's policy's) it has no setting for
                cannot = post_quantum_refusal(platform, unmet.level) if unmet.requirement == "post_quantum" else None
                if cannot is not None:
                    raise PlatformCannot(cannot) from None
            lacks = "; ".join(
                f"no {u.requirement} at level {u.level} (the best it can negotiate here: "
                f"{'none' if u.best_available is None else u.best_available})" for u in exc.unmet)
            raise PlatformCannot(f"{LABELS[platform]}: {lacks or 'no suite meets the minimums'}") from None

    def _check_quota(self, transaction: AgentRequest, host: str, user_id: str, *, device: bool) -> None:
        """In the session's transaction: the user (of ``host``) may hold one more address here, for
        a device or a tunnel.

        Raises:
            DeviceQuotaExceeded: they have ``devices_per_user`` devices enrolled already.
            TunnelQuotaExceeded: they have ``tunnels_per_user`` tunnels up already.
        """
        devices, tunnels = transaction.held_sessions(host, user_id)
        if device and devices >= self.role.devices_per_user:
            raise DeviceQuotaExceeded(
                f"{user_id} (of host {host}) has {devices} devices enrolled at this target, the most its "
                f"devices_per_user ({self.role.devices_per_user}) allows: revoke one of them first")
        if not device and tunnels >= self.role.tunnels_per_user:
            raise TunnelQuotaExceeded(
                f"{user_id} (of host {host}) has {tunnels} tunnels up at this target, the most its "
                f"tunnels_per_user ({self.role.tunnels_per_user}) allows: close one of them first")

    # -- a user's devices ----------------------------------------------------------------

    def user_devices(self, query: UserDevices) -> tuple[UserDeviceList, str]:
        """A Host's question about one of its users' devices here (its signature already checked, or
        from the Host role of this same process):
        with ``revoke``, that device is revoked first if it is that user's and active (its live
        tunnel ends at once and its conn, which takes only its certificate, is unloaded); the
        answer lists the user's devices. (answer, audit detail).

        Raises:
            AgentRejected: addressed to another Target, not fresh, or replayed.
        """
        now = self._clock()
        self._admission.host_keys(query.host)
        if query.target != self.keys.name:
            raise AgentRejected("a question for another target")
        check_fresh(query.timestamp, now)
        with self._store.unit() as uow:
            if not uow.nonces.claim("target", f"host:{query.host}", query.nonce, at(now + REPLAY_TTL)):
                raise AgentRejected("replayed question")
            row = uow.sessions.get(query.revoke) if query.revoke is not None else None
            uow.commit()
        revoked = None
        if (row is not None and row.user_id == query.user_id and row.host_id == query.host
                and row.platform is not None
                and self._book.finish(row.ticket, AgentSessionState.REVOKED, "device revoked by an administrator")):
            revoked = row.ticket
        devices = devices_of(self._store, user_id=query.user_id, host_id=query.host)
        audit = (f"admin-revoke-device user={query.user_id} ticket={query.revoke} revoked={revoked is not None}"
                 if query.revoke is not None else f"admin-devices user={query.user_id} listed={len(devices)}")
        return UserDeviceList(target=self.keys.name, host=query.host, nonce=query.nonce,
                              timestamp=int(self._clock()), user_id=query.user_id, devices=devices,
                              revoked=revoked), audit

    # -- revocation ---------------------------------------------------------------------

    def revoke(self, data: bytes) -> Outcome:
        """Host revoked a user: record it in Target's own list (Host, user and signing key, so that
        Host's later endorsement of that key is refused whatever it says) and end that user's
        sessions (from that Host: another Host's user of the same id is another user, which a
        Host can neither see nor touch). The answer is the count. Sent again (Host retries until
        it is confirmed), it is recorded once and ends what is still active.

        Raises:
            AgentRejected: any check failed.
        """
        now = self._clock()
        _, body, tag = self.keys.open_sealed(data, kinds=[Kind.REVOKE])
        revocation = Revocation.parse(body)
        self._crypto.verify(self._admission.host_keys(revocation.host).sign, Kind.REVOKE, body, tag)
        if revocation.target != self.keys.name:
            raise AgentRejected("revocation for another target")
        check_fresh(revocation.timestamp, now)
        with self._store.unit() as uow:
            if not uow.nonces.claim("target", f"host:{revocation.host}", revocation.nonce, at(now + REPLAY_TTL)):
                raise AgentRejected("replayed revocation")
            uow.revocations.add(user_id=revocation.user_id, sign_public_key=revocation.sign_public_key,
                                host_id=revocation.host)
            tickets = [r.ticket for r in uow.sessions.select(
                state=AgentSessionState.ACTIVE, user_id=revocation.user_id) if r.host_id == revocation.host]
            uow.commit()
        closed = [t for t in tickets if self._book.finish(t, AgentSessionState.REVOKED, "user revoked at host")]
        return Outcome(answer=str(len(closed)).encode(),
                       audit=f"revoke user={revocation.user_id} closed={len(closed)}")

    def revocations(self, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Target's own revocation list, newest first (public keys only; at most ``limit``)."""
        with self._store.unit() as uow:
            return [{"user_id": r.user_id, "sign_public_key": r.sign_public_key, "host": r.host_id,
                     "revoked_at": r.revoked_at.isoformat()} for r in uow.revocations.all(limit)]

    # -- sessions -------------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """End expired sessions, forget stale nonces, and (every 10th sweep, and the first) reconcile
        with charon. Returns the tickets ended because they expired."""
        return self._book.sweep()

    def reconcile(self) -> Reconciled:
        """Make the database and charon agree about agent conns (:meth:`TargetSessions.reconcile
        <app.services.agent.target_sessions.TargetSessions.reconcile>`)."""
        return self._book.reconcile()

    def follower(self, *, concurrency: int = 8) -> SessionFollower:
        """What closes this Target's sessions that an edit of a rating table or policy leaves
        below their minimums (:class:`~app.services.agent.target_edits.SessionFollower`): its
        ``follow`` runs from the sweeper."""
        return SessionFollower(store=self._store, units=self._units, finish=self._book.finish,
                               default_table=self._default_table, concurrency=concurrency)

    def pool(self) -> dict[str, Any]:
        """The virtual-IP pool: its size, how many addresses are leased and free, the per-user device
        quota, and the (Host, user) pairs holding the most addresses
        (:meth:`TargetSessions.usage <app.services.agent.target_sessions.TargetSessions.usage>`)."""
        return {**self._book.usage(), "devices_per_user": self.role.devices_per_user,
                "tunnels_per_user": self.role.tunnels_per_user}

    def sessions(self, *, state: AgentSessionState | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Target's sessions, newest first, without key material (a device's PPK, kept sealed, is named by its id)."""
        return self._book.listing(state=state, limit=limit)
