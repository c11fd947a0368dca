"""Tunnels between two qoss services (peers), each side owning its own end.

The side an application asks (``POST /v1/tunnels`` with ``"responder": "GATEWAY@PEER"``) is the
initiator: it ranks the suites that meet its requirement (the request's minimums, its policy
for the peer, its gateway's algorithms) by its own tables, and offers them in that order. The
peer checks the peering (the gateway and networks it allows) and ranks the offered suites by
its own tables under its own requirement (its policy for the initiator, the request's
minimums judged in its tables, its gateway's algorithms); :func:`app.domain.peering.choose`
picks the suite of least combined rank, ties to the peer's own order. The peer makes the key,
loads its charon as responder, keeps a record of its end (``configuring``) and answers. The
initiator loads its charon, initiates, verifies its end and confirms; the peer then verifies
its own end (``up``). A load never confirmed is unloaded by the peer's sweep within
:data:`~app.domain.peering.PENDING_FOR` seconds; any failure on the initiator's side is undone
there and told to the peer (``teardown``).

Neither side sends the other a rating, a cost or a level: an offer is proposal strings in an
order, an answer an index into it; a refusal says only that nothing offered meets the other
side's requirements.

This module holds the initiator's set-up and routes a peer's messages; the choice is in
:mod:`~app.services.peering.choice`, the responder's part in :mod:`~app.services.peering.responder`,
moves in :mod:`~app.services.peering.moves`, and the messages on the wire in
:mod:`~app.services.peering.messages`.

Blocking (database, charons, the peer over HTTP): call from a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.agent import AgentRejected, Kind, b64e
from app.domain.agent.ports import AgentCrypto, AgentKeys
from app.domain.charon_port import UpReports, ViciFactory
from app.domain.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PeerRefused,
    UnsupportedProtection,
)
from app.domain.negotiation import NegotiationResult
from app.domain.negotiation.post_quantum import PEERED_POST_QUANTUM, peer_without_mlkem
from app.domain.peering import (
    TELL_FOR,
    Answer,
    Confirm,
    Offer,
    Peer,
    PeeredEnd,
    PeerState,
    Teardown,
    UnheardTeardown,
    parse_peered,
    tell_again_in,
    valid_peer_name,
)
from app.domain.policies import Levels
from app.domain.ports import UnitOfWork, UnitOfWorkFactory
from app.domain.requests import PeerSpec, TunnelSpec
from app.domain.tunnels import (
    PeerEnd,
    TunnelRecord,
    TunnelState,
    gateway_capabilities,
    parse_traffic_selectors,
)
from app.services import tunnels as local_tunnels
from app.services.peering.choice import PeeredChoice, entry, ranked, with_ike
from app.services.peering.config import PeeringConfig
from app.services.peering.ends import NoPending, PendingPort, carried, ppk_kept, unrecord
from app.services.peering.messages import (
    Messenger,
    PeerKeysSource,
    PeerLink,
    Received,
    first_sight,
    new_nonce,
    open_message,
    seal_message,
)
from app.services.peering.moves import PeeredMoves
from app.services.peering.responder import PeeredResponder
from app.services.tunnel_setup import bring_up, teardown

__all__ = ["Peering", "PeeringConfig"]

log = logging.getLogger("qoss.peering")

#: The most teardowns a peer did not hear told again by one :meth:`Peering.tell_again`.
TELL_BATCH = 50
#: Seconds one :meth:`Peering.tell_again` sends for at most: peers slow to answer put the rest off
#: to the next round, not past it.
TELL_ROUND_FOR = 10.0
_INBOUND = (Kind.PEER_OFFER, Kind.PEER_CONFIRM, Kind.PEER_TEARDOWN, Kind.PEER_MOVE, Kind.PEER_MOVED)
#: The initiator's confirms sent while its own end comes up (``PeeringConfig.confirm_early``).
_CONFIRMS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="qoss-peer-confirm")


class Peering:
    """This qoss's side of peered tunnels: the peers it knows, the exchange in both roles, the
    sweep of loads never confirmed. Built once per process.

    What it offers a peer and what it takes of a peer's offer is its
    :class:`~app.services.peering.choice.PeeredChoice`'s to decide; what it sends a peer, its
    :class:`~app.services.peering.messages.Messenger` seals, posts and reads the answer of. It
    routes what a peer sends; a peer's offer, confirm and teardown are its
    :class:`~app.services.peering.responder.PeeredResponder`'s to act on, and a move, either
    side's, its :class:`~app.services.peering.moves.PeeredMoves`'s.
    """

    def __init__(self, *, config: PeeringConfig, units: UnitOfWorkFactory, vici: ViciFactory,
                 link: PeerLink, keys: PeerKeysSource, crypto: AgentCrypto, pending: PendingPort | None = None,
                 clock: Any = time.time, reports: UpReports | None = None) -> None:
        self.config = config
        #: Charon's reports of SAs coming up (None: list-sas alone).
        self._reports = reports
        self._pending = pending or NoPending()
        self._keys_source = keys
        self._crypto = crypto
        self._units = units
        self._vici = vici
        self._clock = clock
        self._keys: AgentKeys | None = None
        self._choice = PeeredChoice(config=config)
        self._messenger = Messenger(config=config, link=link, keys=self.keys, crypto=crypto, clock=clock)
        self._responder = PeeredResponder(config=config, units=units, vici=vici, pending=self._pending, clock=clock,
                                          reports=reports)
        self._moves = PeeredMoves(config=config, units=units, vici=vici, pending=self._pending, clock=clock,
                                  messenger=self._messenger)

    # ------------------------------------------------------------------ identity and peers
    def keys(self) -> AgentKeys:
        """This side's peering keys (read once, made on first use)."""
        if self._keys is None:
            with self._units() as uow:
                keys = self._keys_source(uow, self.config.name)
                uow.commit()
            self._keys = keys
        return self._keys

    def identity(self) -> dict[str, str]:
        """What an administrator gives the other side's: this side's name and public keys."""
        public = self.keys().public
        return {"name": self.config.name, "sign_public_key": b64e(public.sign), "kem_public_key": b64e(public.kem),
                **({"mlkem_public_key": b64e(public.mlkem)} if public.mlkem is not None else {})}

    def register(self, *, uow: UnitOfWork, peer: Peer) -> Peer:
        """Register a peer (both sides register each other), for ``POST /v1/peers`` and the console alike.

        Raises:
            InvalidInput: a bad name.
            NotFound: a gateway it may ask for is not one of this side's.
            AlreadyExists: a peer of that name is registered.
        """
        if not valid_peer_name(peer.name):
            raise InvalidInput("a peer's name is 1-63 of a-z, 0-9, '.', '_', '-'")
        for gateway in peer.gateways:
            uow.gateways.get(gateway)  # NotFound: only this side's own gateways
        stored = uow.peers.create(peer)
        uow.events.append("peer.registered", stored.name, {"url": stored.url}, scope="tunnels:read")
        return stored

    def set_state(self, *, uow: UnitOfWork, name: str, state: PeerState) -> Peer:
        """Suspend, resume or revoke a peering. Revoking ends every tunnel it carries, on both
        sides (the peer is told each one; this side's ends are taken down whatever it says).

        Raises:
            NotFound: no such peer.
            Conflict: a revoked peering cannot be resumed or suspended (register it anew).
        """
        current = uow.peers.get(name)
        if current.state is PeerState.REVOKED and state is not PeerState.REVOKED:
            raise Conflict(f"peer {name!r} is revoked: delete nothing, register it again under another name")
        if state is PeerState.REVOKED:
            uow.rollback()
            for record in self._tunnels_of(name):
                self._end(record, current, reason="the peering was revoked")
        peer = uow.peers.set_state(name, state)
        uow.events.append("peer.state", name, {"state": state.value}, scope="tunnels:read")
        return peer

    def _tunnels_of(self, name: str) -> list[TunnelRecord]:
        with self._units() as reads:
            return reads.tunnels.with_peer(name)

    # ------------------------------------------------------------------ the initiator
    def request_tunnel(self, *, uow: UnitOfWork, reads: UnitOfWork, request: TunnelSpec,
                       tunnel_id: str | None = None) -> TunnelRecord:
        """A tunnel from one of this side's gateways to ``GATEWAY@PEER`` (``request.responder``).

        Raises:
            NotFound: no such gateway or peer here.
            Conflict: the peering is suspended or revoked.
            NoFeasibleSuite: nothing meets this side's requirement (nothing was sent).
            PeerUnreachable, PeerTimeout: the peer does not answer (nothing was loaded here).
            PeerNoFeasibleSuite: no suite offered meets the peer's requirements (nothing loaded anywhere).
            PeerRefused: the peer refused otherwise.
            GatewayError: this side's charon failed; the peer was told, nothing stays loaded.
        """
        assert request.responder is not None
        target = parse_peered(request.responder)
        if target is None:
            raise InvalidInput("responder is not GATEWAY@PEER")
        far_gateway, peer_name = target
        peer = reads.peers.get(peer_name)
        if peer.state is not PeerState.ACTIVE:
            raise Conflict(f"the peering with {peer_name} is {peer.state.value}: no new tunnels")
        initiator = reads.gateways.get(request.initiator)
        local_ts = parse_traffic_selectors(request.local_ts or list(initiator.inside_networks), "local_ts")
        wanted = parse_traffic_selectors(list(request.remote_ts), "remote_ts") if request.remote_ts else ()
        inputs = local_tunnels.negotiation_inputs(request)
        result = self._choice.negotiate(reads, peers=(
            PeerSpec(name=f"gw-{initiator.name}"[:64], supports=tuple(sorted(gateway_capabilities(initiator)))),
            local_tunnels.request_peer(inputs),
            PeerSpec(name=f"peer-{peer.name}"[:64], min_levels=peer.min_levels)),
            inputs=inputs, backends=[initiator.backend])
        if result.suite.post_quantum not in (None, "ppk"):
            raise UnsupportedProtection(PEERED_POST_QUANTUM)
        if result.suite.post_quantum == "ppk" and peer.mlkem_key is None:
            raise UnsupportedProtection(peer_without_mlkem(peer.name))
        ours = ranked(result)
        ikes = self._choice.ikes(reads, result, peers=(
            PeerSpec(name=f"gw-{initiator.name}"[:64], supports=tuple(sorted(gateway_capabilities(initiator)))),
            local_tunnels.request_peer(inputs),
            PeerSpec(name=f"peer-{peer.name}"[:64], min_levels=peer.min_levels)),
            inputs=inputs, backends=[initiator.backend])
        reads.rollback()
        uow.rollback()  # nothing is held while the peer and the charons work
        tunnel_id = tunnel_id or secrets.token_hex(6)
        identity = f"{tunnel_id}.{initiator.identity}"
        offer = Offer(tunnel_id=tunnel_id, sender=self.config.name, timestamp=self._clock(), nonce=new_nonce(),
                      gateway=far_gateway, initiator=PeeredEnd(initiator.ike_address, identity, local_ts),
                      networks=wanted, min_levels=Levels.from_dict(inputs.get("min_levels")), suites=tuple(ours),
                      ikes=tuple(i.proposals["ike"] or "" for i in ikes), mode=result.mode,
                      lifetimes=(result.lifetimes["ike"], result.lifetimes["child"]),
                      post_quantum=("ppk",) if result.suite.post_quantum == "ppk" else ())
        # An answer that carries a post-quantum preshared key is only taken sealed hybrid.
        reply = self._messenger.ask(peer, Kind.PEER_OFFER, offer.as_dict(), Kind.PEER_ANSWER,
                                    hybrid_only=bool(offer.post_quantum))
        try:
            answer = Answer.from_dict(reply.document)
            if answer.tunnel_id != tunnel_id or not 0 <= answer.chosen < len(ours) or not 0 <= answer.ike < len(ikes):
                raise InvalidInput("the answer is not to this offer")
        except InvalidInput as exc:
            self._tell(peer, tunnel_id, "the answer could not be used")
            raise PeerRefused(peer.name, f"answered with something this side cannot use ({exc.message})") from exc
        chosen = with_ike(entry(result, ours[answer.chosen]), ikes[answer.ike])
        if chosen.suite.post_quantum == "ppk" and answer.ppk is None:
            self._tell(peer, tunnel_id, "the answer carries no post-quantum preshared key")
            raise PeerRefused(peer.name, "answered without the post-quantum preshared key the tunnel needs")
        far = PeerEnd(address=answer.responder.address, identity=answer.responder.identity,
                      local_identity=identity, site=peer.name, gateway=far_gateway, role="initiator")
        confirm = Confirm(tunnel_id=tunnel_id, sender=self.config.name, timestamp=self._clock(), nonce=new_nonce(),
                          up=True)
        # Early, the peer is asked to confirm while this side initiates: it answers once its own end is
        # up, and the tunnel is kept only when both ends are (either failing, both are undone).
        confirming: Future[Received] | None = _CONFIRMS.submit(
            self._messenger.ask, peer, Kind.PEER_CONFIRM, confirm.as_dict(),
            Kind.PEER_ACK) if self.config.confirm_early else None
        try:
            bring_up(tunnel_id=tunnel_id, initiator=initiator, far=far, local_ts=local_ts,
                     remote_ts=answer.responder.networks, result=chosen, vici=self._vici, psk=answer.psk,
                     reports=self._reports, ppk=answer.ppk)
        except BaseException:
            self._tell(peer, tunnel_id, "the initiator's end did not come up")
            raise
        record = TunnelRecord(id=tunnel_id, initiator=initiator.name, responder=None, local_ts=local_ts,
                              remote_ts=answer.responder.networks, state=TunnelState.UP,
                              negotiation=chosen.as_dict(), peer=far,
                              provenance={"request": dict(inputs), "peer": peer.name, "offered": len(ours),
                                          **ppk_kept(answer.ppk)})

        def keep(unit: UnitOfWork) -> TunnelRecord:
            stored = unit.tunnels.add(record, keep_transaction=False)
            unit.events.append("tunnel.created", tunnel_id, {"state": "up", "suite": record.negotiation["suite"],
                                                             "initiator": record.initiator,
                                                             "peer": f"{far_gateway}@{peer.name}"},
                               scope="tunnels:read")
            return stored
        # Confirmed early, this side's record is committed while the peer's confirmation is on its
        # way (both are needed for the 201; the commit costs no wait of its own); a confirmation that
        # then fails takes the record away again with this side's end.
        kept: TunnelRecord | None = None
        try:
            if confirming is None:
                self._messenger.ask(peer, Kind.PEER_CONFIRM, confirm.as_dict(), Kind.PEER_ACK)
                return uow.commit_with(keep)
            kept = uow.commit_with(keep)
            confirming.result()
            return kept
        except BaseException as exc:
            teardown(record, initiator, None, self._vici, strict=False)
            if kept is not None:
                unrecord(self._units, record, detail=f"the peer did not confirm its end: {exc}"[:200])
            self._tell(peer, tunnel_id, "the initiator could not keep the tunnel")
            raise

    # ------------------------------------------------------------------ the responder
    def receive(self, data: bytes, *, uow: UnitOfWork | None = None, reads: UnitOfWork | None = None,
                admit: Callable[[str], None] | None = None) -> bytes:
        """A peer's message, acted on; the sealed answer.

        ``uow``, ``reads``: the request's units of work, if it has them (else this side's own). A
        confirm's change, its nonce with it, is committed in ``uow`` (so is the request's audit
        record, when the request has one); an offer's nonce goes with its tunnel's record, in a
        transaction of its own before the load; every other message keeps its nonce alone before
        it is acted on. ``admit``: called with the sender's name once the message is opened and its
        signature and time check out, before anything is read or done for it (the peer's rate).

        Raises:
            RateLimited: from ``admit`` (nothing was done for the message).
            AgentRejected: not a message of a registered, active peer, or a replay (403).
            PeerNoFeasibleSuite: nothing offered meets this side's requirements (409).
            InvalidInput: a malformed document (422).
            NotFound: a confirm or teardown of a tunnel this side does not have with the sender.
            GatewayError: this side's charon failed (nothing stays loaded).
        """
        keys = self.keys()
        with contextlib.ExitStack() as stack:
            reads = reads or stack.enter_context(self._units())
            received = open_message(data, keys=keys, crypto=self._crypto, kinds=_INBOUND, find=reads.peers.get,
                                    now=self._clock())
            if admit is not None:
                admit(received.peer.name)
            if received.peer.state is PeerState.REVOKED or (
                    received.kind is Kind.PEER_OFFER and received.peer.state is not PeerState.ACTIVE):
                raise AgentRejected(f"the peering is {received.peer.state.value}")
            if received.kind is Kind.PEER_OFFER:
                answer = self._responder.answer_offer(received, reads, uow or stack.enter_context(self._units()))
                return seal_message(keys, received.peer, Kind.PEER_ANSWER, answer.as_dict(),
                                    post_quantum=answer.ppk is not None)
            confirm = Confirm.from_dict(received.document) if received.kind is Kind.PEER_CONFIRM else None
            if confirm is not None and confirm.up:
                # Sealed while this side's end is still coming up (it is sent only once it is up and kept).
                acked = seal_message(keys, received.peer, Kind.PEER_ACK, {
                    "tunnel_id": confirm.tunnel_id, "sender": self.config.name, "timestamp": int(self._clock()),
                    "nonce": new_nonce()})
                self._responder.confirmed(received, confirm, reads, uow or stack.enter_context(self._units()))
                return acked
            reads.rollback()
        with self._units() as own:  # not the request's: what follows may still fail
            first_sight(own, received)
            own.commit()
        if received.kind is Kind.PEER_MOVE:
            moved = self._moves.answer_move(received)
            return seal_message(keys, received.peer, Kind.PEER_MOVE_ANSWER, moved.as_dict(),
                                post_quantum=moved.ppk is not None)
        if received.kind is Kind.PEER_MOVED:
            done = self._moves.move_confirmed(received.peer, Confirm.from_dict(received.document))
        elif confirm is not None:  # the initiator gave up
            record, gateway = carried(self._units, received.peer, confirm.tunnel_id)
            if record.state is TunnelState.CONFIGURING:
                self._responder.forget(record, gateway)
            done = record.id
        else:
            done = self._responder.torn_down(received.peer, Teardown.from_dict(received.document))
        ack = {"tunnel_id": done, "sender": self.config.name, "timestamp": int(self._clock()), "nonce": new_nonce()}
        return seal_message(keys, received.peer, Kind.PEER_ACK, ack)

    def sweep(self) -> int:
        """Unload every responder's end never confirmed within PENDING_FOR seconds, and take back every
        move never confirmed in time; how many."""
        return self._responder.sweep() + self._moves.sweep_moves()

    # ------------------------------------------------------------------ teardowns a peer did not hear
    def _tell(self, peer: Peer, tunnel_id: str, reason: str) -> None:
        """Tell ``peer`` to take its end of ``tunnel_id`` down; if it does not answer, keep the
        teardown to tell it again (:meth:`tell_again`), so that its end does not outlive ours."""
        if self._messenger.tell(peer, tunnel_id, reason):
            return
        now = datetime.fromtimestamp(self._clock(), UTC)
        with self._units() as uow:
            uow.peers.keep_unheard(UnheardTeardown(peer=peer.name, tunnel_id=tunnel_id, reason=reason[:200],
                                                   first_at=now, attempts=1,
                                                   next_at=now + timedelta(seconds=tell_again_in(1))))
            uow.commit()

    def tell_again(self) -> int:
        """Tell each peer again the teardowns it did not hear and that are due (a fresh message each
        time); how many it heard now. A peer that still does not answer is tried once per call,
        its other due teardowns put off with it (no call waits on one silent peer more than once),
        and no call sends for more than :data:`TELL_ROUND_FOR` seconds (what is left stays due); a
        teardown not heard for :data:`~app.domain.peering.TELL_FOR` seconds is given up."""
        started = self._clock()
        now = datetime.fromtimestamp(started, UTC)
        with self._units() as reads:
            due = reads.peers.unheard_due(now, TELL_BATCH)
            peers: dict[str, Peer | None] = {}
            for teardown in due:
                if teardown.peer not in peers:
                    try:
                        peers[teardown.peer] = reads.peers.get(teardown.peer)
                    except NotFound:
                        peers[teardown.peer] = None
        silent: set[str] = set()
        heard = 0
        for teardown in due:
            if self._clock() - started > TELL_ROUND_FOR:
                break
            peer = peers[teardown.peer]
            told = peer is None or (teardown.peer not in silent
                                    and self._messenger.tell(peer, teardown.tunnel_id, teardown.reason))
            later = None if told else teardown.again(datetime.fromtimestamp(self._clock(), UTC))
            with self._units() as uow:
                if later is None:
                    uow.peers.heard(teardown.peer, teardown.tunnel_id)
                else:
                    uow.peers.keep_unheard(later)
                uow.commit()
            if told:
                heard += peer is not None
            elif later is None:
                log.warning("tunnel %s: peer %s has not heard its end is to be taken down for %d s: given up",
                            teardown.tunnel_id, teardown.peer, int(TELL_FOR))
            else:
                silent.add(teardown.peer)
        return heard

    # ------------------------------------------------------------------ either side
    def delete_tunnel(self, *, uow: UnitOfWork, reads: UnitOfWork, tunnel_id: str) -> None:
        """Take a tunnel down: a peered one on both sides (the peer is told; this side's end goes
        whatever it answers), any other as :func:`app.services.tunnels.delete_tunnel` does."""
        record = reads.tunnels.get(tunnel_id)
        if record.peer is None or record.peer.site is None:
            local_tunnels.delete_tunnel(uow=uow, vici=self._vici, tunnel_id=tunnel_id, reads=reads)
            return
        gateway = reads.gateways.get(record.initiator)
        try:
            peer: Peer | None = reads.peers.get(record.peer.site)
        except NotFound:
            peer = None
        reads.rollback()
        uow.rollback()
        teardown(record, gateway, None, self._vici, strict=True)
        if peer is not None:
            self._tell(peer, record.id, "deleted by its administrator")
        uow.tunnels.delete(tunnel_id)
        uow.events.append("tunnel.deleted", tunnel_id, {}, scope="tunnels:read")

    def _end(self, record: TunnelRecord, peer: Peer, *, reason: str) -> None:
        with self._units() as reads:
            gateway = reads.gateways.get(record.initiator)
        self._tell(peer, record.id, reason)
        self._responder.forget(record, gateway, detail=reason)

    def move_tunnel(self, *, tunnel_id: str) -> tuple[NegotiationResult, Callable[[], None]]:
        """Move a running peered tunnel to a suite both sides accept now, make-before-break: what
        :meth:`PeeredMoves.move <app.services.peering.moves.PeeredMoves.move>` does, returns and raises."""
        return self._moves.move(tunnel_id=tunnel_id)
