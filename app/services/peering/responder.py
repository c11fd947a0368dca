"""The responder's part of a peered tunnel: a peer's offer answered, its confirm and its teardown acted on.

Offered a tunnel, this side checks the peering (the gateway and networks it allows), chooses under
its own requirement (:class:`~app.services.peering.choice.PeeredChoice`), makes the key, loads its
charon as responder and keeps a record of its end (``configuring``) before it answers. Confirmed, it
verifies its own end and marks it ``up``; told to, it takes its end down. A load never confirmed is
unloaded by the sweep within :data:`~app.domain.peering.PENDING_FOR` seconds, or, should this process
die first, by the pending-loads janitor (:class:`~app.services.peering.ends.PendingPort`).

Blocking (database, charons): call from a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.agent import AgentRejected
from app.domain.charon_port import LoadConn, LoadShared, UpReports, ViciFactory
from app.domain.errors import AlreadyExists, GatewayError, NotFound, PeerNoFeasibleSuite, TunnelVerificationFailed
from app.domain.negotiation import NegotiationResult
from app.domain.peering import PENDING_FOR, Answer, Confirm, Offer, Peer, PeeredEnd, Teardown
from app.domain.ports import UnitOfWork, UnitOfWorkFactory
from app.domain.requests import PeerSpec
from app.domain.tunnels import (
    Gateway,
    PeerEnd,
    TunnelEnd,
    TunnelRecord,
    TunnelState,
    conn_name,
    conn_payload,
    expected_sa,
    gateway_capabilities,
    mismatches,
    ppk_secret_name,
)
from app.services import tunnels as local_tunnels
from app.services.peering.choice import PeeredChoice
from app.services.peering.config import PeeringConfig
from app.services.peering.ends import PendingPort, carried, ppk_kept, unrecord
from app.services.peering.messages import Received, first_sight, new_nonce
from app.services.tunnel_setup import new_ppk, observed_sa, teardown

__all__ = ["PeeredResponder"]

log = logging.getLogger("qoss.peering")


@dataclass
class _Awaiting:
    """A responder's load waiting for charon's report of its CHILD_SA coming up (until the confirm)."""

    close: Callable[[], None]
    wait: Callable[[float], Any]
    until: float


class PeeredResponder:
    """This side's part in the peered tunnels a peer sets up: the offers it answers, the confirms and
    teardowns it acts on, the sweep of its loads never confirmed.

    Args:
        config: this service's name as its peers know it, and the seconds one message may take to be
            answered (a confirm waits within them).
        pending: the loads that end by themselves unless released.
        clock: the time, in seconds since the epoch.
        reports: charon's reports of SAs coming up (None: ``list-sas`` alone).
    """

    def __init__(self, *, config: PeeringConfig, units: UnitOfWorkFactory, vici: ViciFactory, pending: PendingPort,
                 clock: Callable[[], float], reports: UpReports | None) -> None:
        self._config = config
        self._units = units
        self._vici = vici
        self._pending = pending
        self._clock = clock
        self._choice = PeeredChoice(config=config)
        #: Charon's reports of SAs coming up, and this side's loads waiting for theirs.
        self._reports = reports
        self._awaiting: dict[str, _Awaiting] = {}
        self._awaiting_lock = threading.Lock()
        #: The ids of the offers whose ends this process is loading now, and their lock.
        self._loading: set[str] = set()
        self._loading_lock = threading.Lock()

    def answer_offer(self, received: Received, reads: UnitOfWork, uow: UnitOfWork) -> Answer:
        """Choose (reading in ``reads``), load and record this side's end of an offer; the answer.

        The load comes first, its tunnel's id refused beforehand if this side has it or is loading
        it now (a load never replaces another tunnel's conn); the record, the offer's nonce and the
        request's audit record (``uow``'s) are then committed at once (a refusal for want of a suite
        keeps the nonce alone). Whatever fails after the load unloads it; a process that dies in
        between leaves the load to the pending-loads janitor, which ends it within ``PENDING_FOR``."""
        peer = received.peer
        offer = Offer.from_dict(received.document)
        if offer.sender != peer.name:
            raise AgentRejected("the offer names another sender")
        if offer.gateway not in peer.gateways:
            raise AgentRejected(f"gateway {offer.gateway!r} is not one this peering allows")
        gateway = reads.gateways.get(offer.gateway)
        wanted = offer.networks or gateway.inside_networks
        why = peer.allows(offer.gateway, wanted)
        if why is not None:
            raise AgentRejected(why)

        def negotiate(supports: set[str], asked: Sequence[PeerSpec]) -> NegotiationResult:
            return self._choice.negotiate(reads, peers=(
                PeerSpec(name=f"gw-{gateway.name}"[:64], supports=tuple(sorted(gateway_capabilities(gateway)))),
                PeerSpec(name=f"peer-{peer.name}"[:64], supports=tuple(sorted(supports)), min_levels=peer.min_levels),
                PeerSpec(name="request", min_levels=offer.min_levels), *asked),
                inputs={}, backends=[gateway.backend])
        try:
            chosen, ike, index = self._choice.choose(negotiate, peer, suites=offer.suites, ikes=offer.ikes,
                                                     mechanisms=offer.post_quantum)
        except PeerNoFeasibleSuite:
            reads.rollback()
            with self._units() as own:
                first_sight(own, received)  # replayed, the offer is refused unread
                own.commit()
            raise
        if reads.tunnels.states([offer.tunnel_id]):
            raise AgentRejected("a tunnel of that id exists here")
        reads.rollback()
        identity = f"{offer.tunnel_id}.{gateway.identity}"
        psk = secrets.token_bytes(32)
        ppk = new_ppk() if chosen.suite.post_quantum == "ppk" else None
        record = TunnelRecord(
            id=offer.tunnel_id, initiator=gateway.name, responder=None, local_ts=tuple(wanted),
            remote_ts=offer.initiator.networks, state=TunnelState.CONFIGURING, negotiation=chosen.as_dict(),
            peer=PeerEnd(address=offer.initiator.address, identity=offer.initiator.identity, local_identity=identity,
                         site=peer.name, gateway=None, role="responder"),
            provenance={"request": {"min_levels": offer.min_levels.as_dict()}, "peer": peer.name,
                        "offered": len(offer.suites), **ppk_kept(ppk)})
        name = conn_name(record.id)
        local = TunnelEnd(gateway.ike_address, identity, tuple(wanted))
        remote = TunnelEnd(offer.initiator.address, offer.initiator.identity, offer.initiator.networks)
        conn = conn_payload(name=name, local=local, remote=remote, ike_proposal=offer.ikes[ike],
                            esp_proposal=offer.suites[index], ah_proposal=None, mode=offer.mode,
                            ike_lifetime=min(offer.lifetimes[0], chosen.lifetimes["ike"]),
                            child_lifetime=min(offer.lifetimes[1], chosen.lifetimes["child"]),
                            ppk_id=ppk[0] if ppk is not None else None)

        def keep(unit: UnitOfWork) -> None:
            first_sight(unit, received)
            try:
                unit.tunnels.add(record, keep_transaction=False)
            except AlreadyExists as exc:
                raise AgentRejected("a tunnel of that id exists here") from exc
            unit.events.append("tunnel.created", record.id, {"state": "configuring", "peer": peer.name},
                               scope="tunnels:read")
        with self._loading_lock:
            if record.id in self._loading:
                raise AgentRejected("a tunnel of that id is being set up here")
            self._loading.add(record.id)
        expires = self._clock() + PENDING_FOR
        try:
            self._pending.hold(socket_path=gateway.vici_socket, conn=name, until=expires)
            try:
                with self._vici(gateway.vici_socket).pipeline() as pipe:
                    pipe.send([LoadShared(name, psk, (local.identity, remote.identity)),
                               *([LoadShared(ppk_secret_name(name), ppk[1], (ppk[0],), "PPK")]
                                 if ppk is not None else []),
                               LoadConn(name, conn)])
                    for reply in pipe.finish():
                        if isinstance(reply, GatewayError):
                            raise reply
                self._await_up(record.id, gateway.vici_socket, name)
                uow.commit_with(keep)
            except BaseException:
                # Unloaded, never recorded: a record of this id is another's (whoever won a race for it).
                with self._awaiting_lock:
                    awaiting = self._awaiting.pop(record.id, None)
                if awaiting is not None:
                    awaiting.close()
                teardown(record, gateway, None, self._vici, strict=False)
                self._pending.release(name)
                raise
        finally:
            with self._loading_lock:
                self._loading.discard(record.id)
        return Answer(tunnel_id=record.id, sender=self._config.name, timestamp=self._clock(), nonce=new_nonce(),
                      chosen=index, ike=ike, responder=PeeredEnd(gateway.ike_address, identity, tuple(wanted)), psk=psk,
                      expires=expires, ppk=ppk)

    def confirmed(self, received: Received, confirm: Confirm, reads: UnitOfWork, uow: UnitOfWork) -> None:
        """The initiator's end is up (or coming up, confirmed early): once this side's own end is up
        with the chosen algorithms, it is marked ``up`` in ``uow``, the confirm's nonce in the same commit.

        Raises:
            TunnelVerificationFailed: this side's end did not come up as chosen in time (it is undone).
        """
        record = reads.tunnels.get(confirm.tunnel_id)
        if record.peer is None or record.peer.site != received.peer.name:
            raise NotFound(f"tunnel {confirm.tunnel_id!r} does not exist")
        gateway = reads.gateways.get(record.initiator)
        reads.rollback()  # nothing is held while this side's charon is asked
        if record.state is not TunnelState.CONFIGURING:
            first_sight(uow, received)
            uow.commit()
            return
        wrong = self._own_end(record, gateway)
        if wrong:
            self.forget(record, gateway)
            raise TunnelVerificationFailed(f"{gateway.name}: " + "; ".join(wrong))
        first_sight(uow, received)
        uow.tunnels.set_state(record.id, TunnelState.UP, "")
        uow.events.append("tunnel.state", record.id, {"state": "up"}, scope="tunnels:read")
        uow.commit()
        self._pending.release(record.conn)

    def _await_up(self, tunnel_id: str, socket_path: str, conn: str) -> None:
        """Listen for charon's report of ``conn`` coming up here, for the confirm to read (a load
        never confirmed has its listening ended by the next load's, past its expiry)."""
        if self._reports is None:
            return
        stack = contextlib.ExitStack()
        wait = stack.enter_context(self._reports.expect(socket_path, conn))
        now = time.monotonic()
        with self._awaiting_lock:
            stale = [k for k, v in self._awaiting.items() if v.until < now]
            ended = [self._awaiting.pop(k) for k in stale]
            self._awaiting[tunnel_id] = _Awaiting(stack.close, wait, now + 2 * PENDING_FOR)
        for gone in ended:
            gone.close()

    def _own_end(self, record: TunnelRecord, gateway: Gateway) -> list[str]:
        """What is wrong with this side's end of ``record`` once it is up (charon's report, else
        ``list-sas`` asked until its CHILD_SA is installed), waiting at most :meth:`_up_wait`
        seconds; empty: up with exactly the chosen algorithms."""
        result = local_tunnels.result_from(record)
        expected = expected_sa(ike=result.ike, protocol=result.suite.protocol, encryption=result.suite.encryption,
                               integrity=result.suite.integrity, post_quantum=result.suite.post_quantum)
        until = time.monotonic() + self._up_wait()
        with self._awaiting_lock:
            awaiting = self._awaiting.pop(record.id, None)
        if awaiting is not None:
            try:
                sa = awaiting.wait(max(0.0, until - time.monotonic()))
            finally:
                awaiting.close()
            seen = observed_sa([sa], record.conn) if sa is not None else None
            if seen is not None and not mismatches(expected, seen):
                return []
        v = self._vici(gateway.vici_socket)
        pause = 0.005
        while True:
            seen = observed_sa(v.list_sas(ike=record.conn), record.conn)
            now = time.monotonic()
            if (seen is not None and seen.ike_state == "ESTABLISHED" and seen.child_state == "INSTALLED") \
                    or now >= until:
                return ["no IKE_SA"] if seen is None else mismatches(expected, seen)
            time.sleep(min(pause, until - now))
            pause = min(2 * pause, 0.2)

    def _up_wait(self) -> float:
        """Seconds a confirm waits for this side's end to come up: within an initiator's timeout
        like this side's own, and well within :data:`PENDING_FOR`."""
        return max(0.5, min(self._config.timeout - 1.0, PENDING_FOR / 2))

    def torn_down(self, peer: Peer, message: Teardown) -> str:
        """A peer's teardown: this side's end of the tunnel taken down and forgotten; the tunnel's id."""
        record, gateway = carried(self._units, peer, message.tunnel_id)
        self.forget(record, gateway, detail=f"taken down by {peer.name}: {message.reason}")
        return record.id

    def forget(self, record: TunnelRecord, gateway: Gateway, detail: str = "") -> None:
        """Take this side's end down and forget it (its record, if it has one)."""
        teardown(record, gateway, None, self._vici, strict=False)
        self._pending.release(record.conn)
        unrecord(self._units, record, detail)

    def sweep(self) -> int:
        """Unload every responder's end never confirmed within PENDING_FOR seconds; how many. It runs
        every second: only the tunnels being set up are read (state ``configuring``, a page at a
        time), never every tunnel this side has."""
        stale = [r for r in local_tunnels.every_tunnel(self._units, page=SWEEP_PAGE, state=TunnelState.CONFIGURING)
                 if r.peer is not None and r.peer.role == "responder" and _age(r) > PENDING_FOR]
        with self._units() as reads:
            gateways = {r.id: reads.gateways.get(r.initiator) for r in stale}
        for record in stale:
            log.info("tunnel %s: never confirmed by its initiator, unloading", record.id)
            self.forget(record, gateways[record.id], detail="never confirmed by the initiator")
        return len(stale)


#: Tunnels read at once by the sweep.
SWEEP_PAGE = 500


def _age(record: TunnelRecord) -> float:
    stamp = record.updated_at or record.created_at
    if stamp is None:
        return 0.0
    return (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()
