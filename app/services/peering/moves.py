"""Moving a running peered tunnel to another suite, make-before-break, in either role.

The side whose edit (its rating tables, its policies, its gateway) left a tunnel below its minimums
moves it: it offers the suites it accepts now (:class:`~app.domain.peering.Move`), loads the peer's
choice, initiates the new CHILD_SA beside the running one, verifies its end and tells the peer. The
side asked to move chooses under its own requirement, loads the choice beside the running SA
(:class:`~app.domain.peering.MoveAnswer`) and keeps the move under way with its tunnel's record
until the moving side's word: then it verifies its own end and records the move, or goes back to
the old proposals. A move never confirmed goes back by the sweep (and, should this process die
first, by the pending-loads janitor, which loads the old conn again).

Blocking (database, charons, the peer over HTTP): call from a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.domain.agent import AgentRejected, Kind
from app.domain.charon_port import ViciFactory, ViciPort
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
from app.domain.peering import PENDING_FOR, Confirm, Move, MoveAnswer, Peer, PeerState
from app.domain.ports import UnitOfWorkFactory
from app.domain.requests import PeerSpec
from app.domain.tunnels import (
    Gateway,
    TunnelEnd,
    TunnelRecord,
    TunnelState,
    conn_payload,
    expected_sa,
    mismatches,
    ppk_secret_name,
)
from app.services import tunnels as local_tunnels
from app.services.peering.choice import PeeredChoice, entry, ranked, requirement, with_ike
from app.services.peering.config import PeeringConfig
from app.services.peering.ends import PendingPort, carried, ppk_kept
from app.services.peering.messages import Messenger, Received, new_nonce
from app.services.tunnel_setup import (
    INITIATE_TIMEOUT_MS,
    close_new_sas,
    load_ppk,
    new_ppk,
    observed_sa,
    old_sas_closer,
    sa_ids,
)

__all__ = ["MOVE_CLAIM_FOR", "PeeredMoves", "moving_out"]

log = logging.getLogger("qoss.peering")

#: Where a record on the side asked to move keeps the move under way (in its provenance).
_MOVING = "moving"
#: Where a record on the moving side keeps its claim on the move (in its provenance).
_MOVING_OUT = "moving_out"
#: Seconds a moving side's claim holds at most: longer than any move takes (a peer's answer, an
#: initiate and a verification, the peer's confirmation); a claim its process never took off
#: (killed) runs out after it.
MOVE_CLAIM_FOR = 120.0


class PeeredMoves:
    """This side's moves of the peered tunnels it carries: the ones it makes, the ones a peer asks
    of it, and the sweep of those never confirmed.

    Args:
        config: this service's name as its peers know it.
        pending: the loads that end by themselves unless released (a move's by loading the old conn back).
        clock: the time, in seconds since the epoch.
        messenger: what sends the peer this side's messages.
    """

    def __init__(self, *, config: PeeringConfig, units: UnitOfWorkFactory, vici: ViciFactory, pending: PendingPort,
                 clock: Callable[[], float], messenger: Messenger) -> None:
        self._config = config
        self._choice = PeeredChoice(config=config)
        self._messenger = messenger
        self._units = units
        self._vici = vici
        self._pending = pending
        self._clock = clock
        #: When the sweep next looks for moves never confirmed (0: at its first run; None: none pending here).
        self._moves_due: float | None = 0.0
        #: The tunnels this process is moving now (the moving side's part), and its lock.
        self._moving_out: set[str] = set()
        self._moves_lock = threading.Lock()

    def move(self, *, tunnel_id: str) -> tuple[NegotiationResult, Callable[[], None]]:
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
            claim = self._claim(tunnel_id)
            try:
                return self._move_out(tunnel_id)
            finally:
                self._unclaim(tunnel_id, claim)
        finally:
            with self._moves_lock:
                self._moving_out.discard(tunnel_id)

    def _claim(self, tunnel_id: str) -> str:
        """Mark the tunnel's record as being moved by this side (until :data:`MOVE_CLAIM_FOR` seconds
        from now), so that no other process here (a replica, the command line) moves it meanwhile and
        a replica asked by the peer to move it at the same time sees this move; the claim's token.

        Raises:
            NotFound: no such tunnel here.
            Conflict: another process here is moving it (its claim has not run out), or the record
                changed while it was claimed.
        """
        with self._units() as uow:
            record = uow.tunnels.get(tunnel_id)
            held = moving_out(record, self._clock())
            if held is not None:
                raise Conflict(f"a move of tunnel {tunnel_id!r} is under way")
            token = secrets.token_hex(8)
            claim = {"token": token, "until": self._clock() + MOVE_CLAIM_FOR}
            if record.updated_at is None or not uow.tunnels.set_provenance(
                    tunnel_id, {**(record.provenance or {}), _MOVING_OUT: claim},
                    unless_changed_since=record.updated_at):
                raise Conflict(f"tunnel {tunnel_id!r} changed as its move began: it is tried again later")
            uow.commit()
        return token

    def _unclaim(self, tunnel_id: str, token: str) -> None:
        """Take this side's claim (``token``) off the record; one that cannot be (the record changed
        meanwhile, twice) runs out by itself."""
        for _ in range(2):
            with self._units() as uow, contextlib.suppress(NotFound):
                record = uow.tunnels.get(tunnel_id)
                claim = (record.provenance or {}).get(_MOVING_OUT)
                if not isinstance(claim, Mapping) or claim.get("token") != token or record.updated_at is None:
                    return
                rest = {k: v for k, v in (record.provenance or {}).items() if k != _MOVING_OUT}
                if uow.tunnels.set_provenance(tunnel_id, rest, unless_changed_since=record.updated_at):
                    uow.commit()
                    return
        log.info("tunnel %s: its move's claim is left to run out", tunnel_id)

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
        move = Move(tunnel_id=record.id, sender=self._config.name, timestamp=self._clock(), nonce=new_nonce(),
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
        old_ikes, old_children = sa_ids(v.list_sas(ike=name), name)
        try:
            if ppk is not None:  # the new SA's key replaces the old one's (a PPK enters only an IKE_SA's making)
                load_ppk(v, name, ppk)
            v.load_conn(name, _peered_conn(record, gateway, new, ppk_id=ppk[0] if ppk is not None else None))
            v.initiate(child=name, ike=name, timeout_ms=INITIATE_TIMEOUT_MS)
            _check_new(v, gateway.name, name, new, old_children)
            self._messenger.ask(peer, Kind.PEER_MOVED, Confirm(tunnel_id=record.id, sender=self._config.name,
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
        close_old = old_sas_closer(v, name, old, new, old_ikes, old_children, ppk_holders=(v,))
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
        message = Confirm(tunnel_id=tunnel_id, sender=self._config.name, timestamp=self._clock(), nonce=new_nonce(),
                          up=up)
        try:
            self._messenger.ask(peer, Kind.PEER_MOVED, message.as_dict(), Kind.PEER_ACK)
        except (PeerError, NotFound) as exc:
            log.warning("tunnel %s: peer %s was not told that the move was given up: %s", tunnel_id, peer.name, exc)

    def answer_move(self, received: Received) -> MoveAnswer:
        """The other side moves a tunnel both carry: choose under this side's requirement, load the
        choice beside the running SA (back to the old one at the deadline unless confirmed)."""
        peer = received.peer
        move = Move.from_dict(received.document)
        if move.sender != peer.name:
            raise AgentRejected("the move names another sender")
        record, gateway = carried(self._units, peer, move.tunnel_id)
        if record.state not in (TunnelState.UP, TunnelState.NONCOMPLIANT):
            raise AgentRejected("the tunnel is not running here")
        with self._moves_lock:
            moving = move.tunnel_id in self._moving_out or moving_out(record, self._clock()) is not None
        if moving and self._config.name < peer.name:  # both sides move it at once: the lesser name's goes on
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
        _, children = sa_ids(v.list_sas(ike=name), name)
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
                load_ppk(v, name, ppk)
            v.load_conn(name, _peered_conn(record, gateway, new, ppk_id=ppk[0] if ppk is not None else None))
        except BaseException:
            self._move_undone(dataclasses.replace(record, provenance={**(record.provenance or {}), _MOVING: {
                **was, **ppk_kept(ppk)}}), gateway)
            raise
        return MoveAnswer(tunnel_id=record.id, sender=self._config.name, timestamp=self._clock(), nonce=new_nonce(),
                          chosen=index, ike=ike, expires=expires, ppk=ppk)

    def move_confirmed(self, peer: Peer, confirm: Confirm) -> str:
        """The moving side's word on its new SA: verify this side's end and record the move, or go back."""
        record, gateway = carried(self._units, peer, confirm.tunnel_id)
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

    def sweep_moves(self) -> int:
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
            load_ppk(v, record.conn, ppk)
        v.load_conn(record.conn, _peered_conn(record, gateway, old,
                                              ppk_id=ppk[0] if ppk is not None else None))
    if ppk is not None and old.suite.post_quantum != "ppk":
        with contextlib.suppress(GatewayError, ValueError):
            v.unload_shared(ppk_secret_name(record.conn))
    with contextlib.suppress(GatewayError, ValueError):
        close_new_sas(v, record.conn, old_ikes, old_children)


def moving_out(record: TunnelRecord, now: float) -> Mapping[str, Any] | None:
    """The claim of a move this side is making of ``record`` (any process here), if one holds at ``now``."""
    claim = (record.provenance or {}).get(_MOVING_OUT)
    if isinstance(claim, Mapping) and isinstance(claim.get("until"), int | float) and claim["until"] >= now:
        return claim
    return None


def _moving(record: TunnelRecord) -> Mapping[str, Any] | None:
    """The move of ``record`` under way on the side asked to move, if any."""
    moving = (record.provenance or {}).get(_MOVING)
    return moving if isinstance(moving, Mapping) else None


def _without_moving(record: TunnelRecord) -> dict[str, Any]:
    return {k: v for k, v in (record.provenance or {}).items() if k != _MOVING}


def _suite_of(negotiation: Mapping[str, Any]) -> dict[str, Any]:
    return {"suite": negotiation.get("suite"), "proposals": negotiation.get("proposals"),
            "cost": negotiation.get("cost")}
