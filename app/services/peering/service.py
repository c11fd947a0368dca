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

Blocking (database, charons, the peer over HTTP): call from a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from app.domain.agent import AgentRejected, Kind, b64e
from app.domain.agent.ports import AgentCrypto, AgentKeys
from app.domain.errors import (
    Conflict,
    GatewayError,
    InvalidInput,
    NotFound,
    PeerError,
    PeerRefused,
    TunnelVerificationFailed,
    UnsupportedProtection,
)
from app.domain.negotiation import NegotiationResult
from app.domain.negotiation.post_quantum import PEERED_POST_QUANTUM, peer_without_mlkem
from app.domain.peering import (
    PENDING_FOR,
    Answer,
    Confirm,
    Move,
    MoveAnswer,
    Offer,
    Peer,
    PeeredEnd,
    PeerState,
    Teardown,
    parse_peered,
    valid_peer_name,
)
from app.domain.policies import Levels
from app.domain.ports import LoadShared, UnitOfWork, UnitOfWorkFactory, UpReports, ViciFactory, ViciPort
from app.domain.requests import PeerSpec, TunnelSpec
from app.domain.tunnels import (
    Gateway,
    PeerEnd,
    TunnelEnd,
    TunnelRecord,
    TunnelState,
    conn_payload,
    expected_sa,
    gateway_capabilities,
    mismatches,
    parse_traffic_selectors,
    ppk_secret_name,
)
from app.services import tunnels as local_tunnels
from app.services.peering.choice import PeeredChoice, entry, ranked, requirement, with_ike
from app.services.peering.config import PeeringConfig
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
from app.services.peering.responder import NoPending, PeeredResponder, PendingPort, ours, ppk_kept
from app.services.tunnel_setup import INITIATE_TIMEOUT_MS, bring_up, new_ppk, observed_sa, teardown

__all__ = ["Peering", "PeeringConfig"]

log = logging.getLogger("qoss.peering")

_INBOUND = (Kind.PEER_OFFER, Kind.PEER_CONFIRM, Kind.PEER_TEARDOWN, Kind.PEER_MOVE, Kind.PEER_MOVED)
#: Where a record on the side asked to move keeps the move under way (in its provenance).
_MOVING = "moving"
#: The initiator's confirms sent while its own end comes up (``PeeringConfig.confirm_early``).
_CONFIRMS = ThreadPoolExecutor(max_workers=32, thread_name_prefix="qoss-peer-confirm")


class Peering:
    """This qoss's side of peered tunnels: the peers it knows, the exchange in both roles, the
    sweep of loads never confirmed. Built once per process.

    What it offers a peer and what it takes of a peer's offer is its
    :class:`~app.services.peering.choice.PeeredChoice`'s to decide; what it sends a peer, its
    :class:`~app.services.peering.messages.Messenger` seals, posts and reads the answer of. It
    routes what a peer sends; a peer's offer, confirm and teardown are its
    :class:`~app.services.peering.responder.PeeredResponder`'s to act on.
    """

    def __init__(self, *, config: PeeringConfig, units: UnitOfWorkFactory, vici: ViciFactory,
                 link: PeerLink, keys: PeerKeysSource, crypto: AgentCrypto, pending: PendingPort | None = None,
                 clock: Any = time.time, reports: UpReports | None = None) -> None:
        self.config = config
        #: Charon's reports of SAs coming up (None: list-sas alone).
        self._reports = reports
        self._pending = pending or NoPending()
        #: When the sweep next looks for moves never confirmed (0: at its first run; None: none pending here).
        self._moves_due: float | None = 0.0
        #: The tunnels this process is moving now (the moving side's part), and its lock.
        self._moving_out: set[str] = set()
        self._moves_lock = threading.Lock()
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
            return [r for r in reads.tunnels.list() if r.peer is not None and r.peer.site == name]

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
            self._messenger.tell(peer, tunnel_id, "the answer could not be used")
            raise PeerRefused(peer.name, f"answered with something this side cannot use ({exc.message})") from exc
        chosen = with_ike(entry(result, ours[answer.chosen]), ikes[answer.ike])
        if chosen.suite.post_quantum == "ppk" and answer.ppk is None:
            self._messenger.tell(peer, tunnel_id, "the answer carries no post-quantum preshared key")
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
            self._messenger.tell(peer, tunnel_id, "the initiator's end did not come up")
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
                self._responder.unrecord(record, detail=f"the peer did not confirm its end: {exc}"[:200])
            self._messenger.tell(peer, tunnel_id, "the initiator could not keep the tunnel")
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
            moved = self._answer_move(received)
            return seal_message(keys, received.peer, Kind.PEER_MOVE_ANSWER, moved.as_dict(),
                                post_quantum=moved.ppk is not None)
        if received.kind is Kind.PEER_MOVED:
            done = self._move_confirmed(received.peer, Confirm.from_dict(received.document))
        elif confirm is not None:  # the initiator gave up
            record, gateway = ours(self._units, received.peer, confirm.tunnel_id)
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
        return self._responder.sweep() + self._sweep_moves()

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
            self._messenger.tell(peer, record.id, "deleted by its administrator")
        uow.tunnels.delete(tunnel_id)
        uow.events.append("tunnel.deleted", tunnel_id, {}, scope="tunnels:read")

    def _end(self, record: TunnelRecord, peer: Peer, *, reason: str) -> None:
        with self._units() as reads:
            gateway = reads.gateways.get(record.initiator)
        self._messenger.tell(peer, record.id, reason)
        self._responder.forget(record, gateway, detail=reason)

    # ------------------------------------------------------------------ moves
    def move_tunnel(self, *, tunnel_id: str) -> tuple[NegotiationResult, Callable[[], None]]:
        """Move a running peered tunnel to a suite both sides accept now, make-before-break: an
        edit on this side (its rating tables, its policies, its gateway) left it below this side's
        minimums. Either side may start it, whichever role it had in the set-up.

        This side offers the peer the suites it accepts now, cheapest first by its own tables
        (:class:`~app.domain.peering.Move`); the peer chooses under its own requirement by
        :func:`~app.domain.peering.choose` and loads the choice beside the running SA
        (:class:`~app.domain.peering.MoveAnswer`); this side loads it, initiates the new
        CHILD_SA (in a new IKE_SA when the IKE proposal changes), verifies its end, and tells
        the peer, which verifies its own end and records the move. Any failure loads the old
        proposals back on both sides and closes whatever new SA came up: the tunnel runs on as
        before, and the error says why. Nothing of this side's ratings is sent.

        Returns:
            The suite now running (for this side to record), and what closes the old SAs (call it
            a little later: packets sealed with them are still on their way).

        Raises:
            NotFound: no such tunnel here, or not one with a peer.
            Conflict: the peering is revoked, the peer's own move of the tunnel is pending, or this
                side's is under way.
            NoFeasibleSuite: nothing meets this side's requirement now (nothing was sent).
            UnsupportedProtection: this side's requirement now asks for post-quantum protection other
                than a preshared key, or for one and the peer registered no ML-KEM-768 key.
            PeerUnreachable, PeerTimeout: the peer does not answer (nothing changed here).
            PeerNoFeasibleSuite: nothing this side offered meets the peer's requirements.
            PeerRefused: the peer refused otherwise.
            GatewayError, TunnelVerificationFailed: a charon failed (both sides are back as before).
        """
        with self._moves_lock:
            if tunnel_id in self._moving_out:
                raise Conflict(f"a move of tunnel {tunnel_id!r} is under way")
            self._moving_out.add(tunnel_id)
        try:
            return self._move_out(tunnel_id)
        finally:
            with self._moves_lock:
                self._moving_out.discard(tunnel_id)

    def _move_out(self, tunnel_id: str) -> tuple[NegotiationResult, Callable[[], None]]:
        with self._units() as reads:
            record = reads.tunnels.get(tunnel_id)
            if record.peer is None or record.peer.site is None:
                raise NotFound(f"tunnel {tunnel_id!r} is not one with a peer")
            gateway = reads.gateways.get(record.initiator)
            peer = reads.peers.get(record.peer.site)
            if peer.state is PeerState.REVOKED:
                raise Conflict(f"the peering with {peer.name} is revoked")
            earlier = _moving(record)
            if earlier is not None and float(earlier["until"]) >= self._clock():
                raise Conflict(f"{peer.name} is moving the tunnel itself: this side's move waits for its next try")
            peers, inputs = requirement(record, gateway, peer)
            result = self._choice.negotiate(reads, peers=peers, inputs=inputs, backends=[gateway.backend])
            if result.suite.post_quantum not in (None, "ppk"):  # as for a new tunnel with a peer
                raise UnsupportedProtection(PEERED_POST_QUANTUM)
            if result.suite.post_quantum == "ppk" and peer.mlkem_key is None:
                raise UnsupportedProtection(peer_without_mlkem(peer.name))
            ours = ranked(result)
            ikes = self._choice.ikes(reads, result, peers=peers, inputs=inputs, backends=[gateway.backend])
        move = Move(tunnel_id=record.id, sender=self.config.name, timestamp=self._clock(), nonce=new_nonce(),
                    suites=tuple(ours), ikes=tuple(i.proposals["ike"] or "" for i in ikes),
                    post_quantum=("ppk",) if result.suite.post_quantum == "ppk" else ())
        # An answer that carries a post-quantum preshared key is only taken sealed hybrid.
        reply = self._messenger.ask(peer, Kind.PEER_MOVE, move.as_dict(), Kind.PEER_MOVE_ANSWER,
                                    hybrid_only=bool(move.post_quantum))
        try:
            answer = MoveAnswer.from_dict(reply.document)
            if answer.tunnel_id != record.id or not 0 <= answer.chosen < len(ours) or not 0 <= answer.ike < len(ikes):
                raise InvalidInput("the answer is not to this move")
        except InvalidInput as exc:
            self._moved(peer, record.id, up=False)
            raise PeerRefused(peer.name, f"answered with something this side cannot use ({exc.message})") from exc
        new = with_ike(entry(result, ours[answer.chosen]), ikes[answer.ike])
        ppk = answer.ppk if new.suite.post_quantum == "ppk" else None
        if new.suite.post_quantum == "ppk" and ppk is None:
            self._moved(peer, record.id, up=False)
            raise PeerRefused(peer.name, "answered without the post-quantum preshared key the move needs")
        old = local_tunnels.result_from(record)
        name, v = record.conn, self._vici(gateway.vici_socket)
        old_ikes, old_children = _sa_ids(v.list_sas(ike=name), name)
        try:
            if ppk is not None:  # the new SA's key replaces the old one's (a PPK enters only an IKE_SA's making)
                _load_ppk(v, name, ppk)
            v.load_conn(name, _peered_conn(record, gateway, new, ppk_id=ppk[0] if ppk is not None else None))
            v.initiate(child=name, ike=name, timeout_ms=INITIATE_TIMEOUT_MS)
            _check_new(v, gateway.name, name, new, old_children)
            self._messenger.ask(peer, Kind.PEER_MOVED, Confirm(tunnel_id=record.id, sender=self.config.name,
                                                               timestamp=self._clock(), nonce=new_nonce(),
                                                               up=True).as_dict(),
                                Kind.PEER_ACK)
        except BaseException:
            _back_to(v, record, gateway, old, old_ikes, old_children, ppk)
            if ppk is not None and old.suite.post_quantum == "ppk":  # the restored conn names the new key
                self._kept_ppk(record, ppk)
            self._moved(peer, record.id, up=False)
            raise
        self._kept_ppk(record, ppk)
        # A new IKE proposal, or a PPK on either suite (it is mixed into an IKE_SA's keys as it is
        # made): the new CHILD_SA lives in a new IKE_SA.
        new_ike = new.proposals["ike"] != old.proposals["ike"] or "ppk" in (new.suite.post_quantum,
                                                                            old.suite.post_quantum)

        def close_old() -> None:
            for ike_id in sorted(old_ikes) if new_ike else ():
                with contextlib.suppress(GatewayError):
                    v.terminate(ike_id=ike_id, timeout_ms=3000)
            for child_id in () if new_ike else sorted(old_children):
                with contextlib.suppress(GatewayError):
                    v.terminate(child_id=child_id, timeout_ms=3000)
            if old.suite.post_quantum == "ppk" and ppk is None:  # the new suite has none: the old key goes too
                with contextlib.suppress(GatewayError):
                    v.unload_shared(ppk_secret_name(name))
        return new, close_old

    def _kept_ppk(self, record: TunnelRecord, ppk: tuple[str, bytes] | None) -> None:
        """Keep the id of the PPK ``record``'s conn now names (none: forget it) with its record (the
        caller records the new suite itself)."""
        provenance = {key: value for key, value in (record.provenance or {}).items() if key != "ppk_id"}
        provenance.update(ppk_kept(ppk))
        if provenance == (record.provenance or {}):
            return
        with self._units() as uow, contextlib.suppress(NotFound):
            uow.tunnels.set_negotiation(record.id, record.negotiation, provenance, record.detail)
            uow.commit()

    def _moved(self, peer: Peer, tunnel_id: str, *, up: bool) -> None:
        """Tell ``peer`` that this side gave up a move (``up`` false); one it does not hear goes
        back to its old proposals by itself at its deadline."""
        message = Confirm(tunnel_id=tunnel_id, sender=self.config.name, timestamp=self._clock(), nonce=new_nonce(),
                          up=up)
        try:
            self._messenger.ask(peer, Kind.PEER_MOVED, message.as_dict(), Kind.PEER_ACK)
        except (PeerError, NotFound) as exc:
            log.warning("tunnel %s: peer %s was not told that the move was given up: %s", tunnel_id, peer.name, exc)

    def _answer_move(self, received: Received) -> MoveAnswer:
        """The other side moves a tunnel both carry: choose under this side's requirement, load the
        choice beside the running SA (back to the old one at the deadline unless confirmed)."""
        peer = received.peer
        move = Move.from_dict(received.document)
        if move.sender != peer.name:
            raise AgentRejected("the move names another sender")
        record, gateway = ours(self._units, peer, move.tunnel_id)
        if record.state not in (TunnelState.UP, TunnelState.NONCOMPLIANT):
            raise AgentRejected("the tunnel is not running here")
        with self._moves_lock:
            moving_out = move.tunnel_id in self._moving_out
        if moving_out and self.config.name < peer.name:  # both sides move it at once: the lesser name's goes on
            raise AgentRejected("this side is moving the tunnel itself")
        earlier = _moving(record)
        if earlier is not None and float(earlier["until"]) >= self._clock():
            raise AgentRejected("a move of this tunnel is under way")
        why = peer.allows(gateway.name, record.local_ts)
        if why is not None:
            raise AgentRejected(why)
        with self._units() as reads:
            peers, inputs = requirement(record, gateway, peer)

            def negotiate(supports: set[str], asked: Sequence[PeerSpec]) -> NegotiationResult:
                offered = PeerSpec(name="offered", supports=tuple(sorted(supports)))
                return self._choice.negotiate(reads, peers=(*peers, offered, *asked), inputs=inputs,
                                              backends=[gateway.backend])
            new, ike, index = self._choice.choose(negotiate, peer, suites=move.suites, ikes=move.ikes,
                                                  mechanisms=move.post_quantum)
        name, v = record.conn, self._vici(gateway.vici_socket)
        _, children = _sa_ids(v.list_sas(ike=name), name)
        expires = self._clock() + PENDING_FOR
        ppk = new_ppk() if new.suite.post_quantum == "ppk" else None  # the new SA's, made here as for a new tunnel
        was = earlier or {"state": record.state.value, "detail": record.detail}  # an earlier move's, never swept
        with self._units() as uow:
            uow.tunnels.set_negotiation(record.id, record.negotiation, {**(record.provenance or {}), _MOVING: {
                "negotiation": new.as_dict(), "until": expires, "children": sorted(children),
                "state": was["state"], "detail": was["detail"], **ppk_kept(ppk)}},
                f"moving to {new.proposals['esp']}, asked by {peer.name}"[:500])
            uow.commit()
        due = self._moves_due
        self._moves_due = expires if due is None else min(due, expires)
        old = local_tunnels.result_from(record)
        # Back at the deadline, an old suite with a PPK names the key loaded now (the new one replaces it).
        self._pending.hold(socket_path=gateway.vici_socket, conn=name, until=expires,
                           restore=_peered_conn(record, gateway, old, ppk_id=ppk[0] if ppk is not None else None))
        try:
            if ppk is not None:
                _load_ppk(v, name, ppk)
            v.load_conn(name, _peered_conn(record, gateway, new, ppk_id=ppk[0] if ppk is not None else None))
        except BaseException:
            self._move_undone(dataclasses.replace(record, provenance={**(record.provenance or {}), _MOVING: {
                **was, **ppk_kept(ppk)}}), gateway)
            raise
        return MoveAnswer(tunnel_id=record.id, sender=self.config.name, timestamp=self._clock(), nonce=new_nonce(),
                          chosen=index, ike=ike, expires=expires, ppk=ppk)

    def _move_confirmed(self, peer: Peer, confirm: Confirm) -> str:
        """The moving side's word on its new SA: verify this side's end and record the move, or go back."""
        record, gateway = ours(self._units, peer, confirm.tunnel_id)
        moving = _moving(record)
        if moving is None:
            return record.id  # nothing under way (given up already): nothing to do
        if not confirm.up:
            self._move_undone(record, gateway, f"{peer.name} gave the move up")
            return record.id
        if float(moving["until"]) < self._clock():
            self._move_undone(record, gateway, "the move was confirmed too late")
            raise AgentRejected("the move was confirmed too late: this side is back on the old suite")
        new = local_tunnels.result_from(dataclasses.replace(record, negotiation=moving["negotiation"]))
        v = self._vici(gateway.vici_socket)
        try:
            _check_new(v, gateway.name, record.conn, new, frozenset(moving["children"]))
        except BaseException:
            self._move_undone(record, gateway, "this side's end of the new SA did not check out")
            raise
        self._pending.release(record.conn)
        old_ppk = local_tunnels.result_from(record).suite.post_quantum == "ppk"
        if old_ppk and new.suite.post_quantum != "ppk":  # the new SA has none: the old one's key goes
            with contextlib.suppress(GatewayError):
                v.unload_shared(ppk_secret_name(record.conn))
        old = record.negotiation.get("proposals", {}).get("esp")
        detail = f"moved from {old} to {new.proposals['esp']} (asked by {peer.name})"
        with self._units() as uow:
            kept = {key: value for key, value in _without_moving(record).items() if key != "ppk_id"}
            uow.tunnels.set_negotiation(record.id, moving["negotiation"],
                                        {**kept, **({"ppk_id": moving["ppk_id"]} if "ppk_id" in moving else {})},
                                        detail[:500])
            uow.events.append("tunnel.moved", record.id, {"kind": "peer", "cause": f"asked by {peer.name}",
                                                          "old": _suite_of(record.negotiation),
                                                          "new": _suite_of(moving["negotiation"])},
                              scope="tunnels:read")
            uow.audit.append(request_id=f"peer-{secrets.token_hex(6)}", token_id=None, token_name=None, scopes=[],
                             source=peer.name, action="POST", object=f"/v1/tunnels/{record.id}", outcome=200,
                             detail=detail[:200])
            uow.commit()
        return record.id

    def _move_undone(self, record: TunnelRecord, gateway: Gateway, detail: str = "") -> None:
        """Back to the suite ``record`` runs on: its conn loaded again (its SAs never left), the move
        forgotten. A PPK the move loaded stays, named by the old conn if its suite has one (the new key
        replaced the old one, and the running IKE_SA needs neither), else unloaded."""
        moving = _moving(record) or {}
        old = local_tunnels.result_from(record)
        moved_ppk = moving.get("ppk_id") if isinstance(moving.get("ppk_id"), str) else None
        v = self._vici(gateway.vici_socket)
        try:
            v.load_conn(record.conn, _peered_conn(record, gateway, old, ppk_id=moved_ppk))
        except GatewayError as exc:  # the janitor loads it back at the deadline
            log.warning("tunnel %s: loading its old proposals back failed: %s", record.id, exc.message)
        else:
            self._pending.release(record.conn)
        if moved_ppk is not None and old.suite.post_quantum != "ppk":
            with contextlib.suppress(GatewayError):
                v.unload_shared(ppk_secret_name(record.conn))
        state = TunnelState(moving.get("state", TunnelState.UP.value))
        before = str(moving.get("detail", record.detail))
        with self._units() as uow, contextlib.suppress(NotFound):
            kept = _without_moving(record)
            if moved_ppk is not None and old.suite.post_quantum == "ppk":
                kept["ppk_id"] = moved_ppk
            uow.tunnels.set_negotiation(record.id, record.negotiation, kept, before[:500])
            if state is not TunnelState.UP:
                uow.tunnels.set_state(record.id, state, before[:500])
            if detail:
                uow.events.append("tunnel.state", record.id, {"state": state.value, "detail": f"not moved: {detail}"},
                                  scope="tunnels:read")
            uow.commit()

    def _sweep_moves(self) -> int:
        """Go back to the old suite of every move the moving side never confirmed in time; how many.
        The tunnels are read only when a move answered here is due (and at the first sweep, for the
        moves a process before this one left)."""
        now = self._clock()
        if self._moves_due is None or now < self._moves_due:
            return 0
        self._moves_due = None
        with self._units() as reads:
            moving = [(r, float(m["until"])) for r in reads.tunnels.list()
                      if r.peer is not None and (m := _moving(r)) is not None]
            stale = [r for r, until in moving if until < now]
            gateways = {r.id: reads.gateways.get(r.initiator) for r in stale}
        later = [until for _, until in moving if until >= now]
        if self._moves_due is not None:  # one answered meanwhile
            later.append(self._moves_due)
        self._moves_due = min(later, default=None)
        for record in stale:
            log.info("tunnel %s: a move never confirmed by its peer, back to the old suite", record.id)
            self._move_undone(record, gateways[record.id], "the move was never confirmed")
        return len(stale)


def _peered_conn(record: TunnelRecord, gateway: Gateway, result: NegotiationResult,
                 ppk_id: str | None = None) -> dict[str, Any]:
    """The ``load-conn`` settings of this side's end of the peered tunnel ``record`` on ``result``'s
    proposals; with a post-quantum preshared key where ``result`` has one: ``ppk_id`` (else the
    one ``record`` keeps)."""
    assert record.peer is not None
    if result.suite.post_quantum == "ppk":
        kept = (record.provenance or {}).get("ppk_id")
        ppk_id = ppk_id or (kept if isinstance(kept, str) else None)
    else:
        ppk_id = None
    ike = result.proposals["ike"]
    assert ike is not None
    return conn_payload(name=record.conn, local=TunnelEnd(gateway.ike_address, record.peer.local_identity,
                                                          record.local_ts),
                        remote=TunnelEnd(record.peer.address, record.peer.identity, record.remote_ts),
                        ike_proposal=ike, esp_proposal=result.proposals["esp"], ah_proposal=None, mode=result.mode,
                        ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"], ppk_id=ppk_id)


def _load_ppk(v: ViciPort, name: str, ppk: tuple[str, bytes]) -> None:
    """Load (or replace) conn ``name``'s post-quantum preshared key.

    Raises:
        GatewayError: charon refused it or did not answer.
    """
    reply = v.batch([LoadShared(ppk_secret_name(name), ppk[1], (ppk[0],), "PPK")])[0]
    if isinstance(reply, GatewayError):
        raise reply


def _sa_ids(sas: Sequence[Any], name: str) -> tuple[frozenset[int], frozenset[int]]:
    """The unique ids of conn ``name``'s IKE_SAs and CHILD_SAs in a ``list-sas`` answer."""
    ikes = frozenset(sa.uniqueid for sa in sas if sa.name == name)
    children = frozenset(c.uniqueid for sa in sas if sa.name == name for c in sa.children if c.name == name)
    return ikes, children


def _check_new(v: ViciPort, side: str, name: str, result: NegotiationResult, besides: frozenset[int]) -> None:
    """A CHILD_SA of conn ``name`` other than ``besides`` (the old ones) runs exactly ``result``'s algorithms.

    Raises:
        TunnelVerificationFailed: none does (the message names the end and every difference).
    """
    expected = expected_sa(ike=result.ike, protocol=result.suite.protocol, encryption=result.suite.encryption,
                           integrity=result.suite.integrity, post_quantum=result.suite.post_quantum)
    seen = observed_sa(v.list_sas(ike=name), name, besides=besides)
    wrong = [f"no new CHILD_SA {name}"] if seen is None else mismatches(expected, seen)
    if wrong:
        raise TunnelVerificationFailed(f"{side}: " + "; ".join(wrong))


def _back_to(v: ViciPort, record: TunnelRecord, gateway: Gateway, old: NegotiationResult,
             old_ikes: frozenset[int], old_children: frozenset[int], ppk: tuple[str, bytes] | None = None) -> None:
    """Undo this side's part of a move: the old proposals loaded again, every new SA closed. ``ppk``: the
    move's new PPK, which stays (loaded, so that both sides hold the same) named by the old conn if its
    suite has one, else goes."""
    with contextlib.suppress(GatewayError, ValueError):
        if ppk is not None and old.suite.post_quantum == "ppk":
            _load_ppk(v, record.conn, ppk)
        v.load_conn(record.conn, _peered_conn(record, gateway, old,
                                              ppk_id=ppk[0] if ppk is not None else None))
    if ppk is not None and old.suite.post_quantum != "ppk":
        with contextlib.suppress(GatewayError, ValueError):
            v.unload_shared(ppk_secret_name(record.conn))
    with contextlib.suppress(GatewayError, ValueError):
        now_ikes, now_children = _sa_ids(v.list_sas(ike=record.conn), record.conn)
        for ike_id in sorted(now_ikes - old_ikes):
            v.terminate(ike_id=ike_id, timeout_ms=3000, force=True)
        for child_id in sorted(now_children - old_children):
            v.terminate(child_id=child_id, timeout_ms=3000, force=True)


def _moving(record: TunnelRecord) -> Mapping[str, Any] | None:
    """The move of ``record`` under way on the side asked to move, if any."""
    moving = (record.provenance or {}).get(_MOVING)
    return moving if isinstance(moving, Mapping) else None


def _without_moving(record: TunnelRecord) -> dict[str, Any]:
    return {k: v for k, v in (record.provenance or {}).items() if k != _MOVING}


def _suite_of(negotiation: Mapping[str, Any]) -> dict[str, Any]:
    return {"suite": negotiation.get("suite"), "proposals": negotiation.get("proposals"),
            "cost": negotiation.get("cost")}
