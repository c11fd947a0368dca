"""Tunnels: negotiate for two gateways (or a gateway and an unmanaged peer), bring the suite
up in strongSwan (``app.services.tunnel_setup``), keep the record; list, inspect, delete."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.algorithms import CATALOGUE
from app.domain.charon_port import UpReports, ViciFactory
from app.domain.errors import (
    AlreadyExists,
    Conflict,
    GatewayError,
    InvalidInput,
    NoFeasibleSuite,
    NotFound,
    UnsupportedProtection,
)
from app.domain.negotiation import Backend, NegotiationResult
from app.domain.policies import Levels, TrafficProfile
from app.domain.ports import NO_METRICS, Metrics, TunnelStore, UnitOfWork, UnitOfWorkFactory, error_label
from app.domain.requests import NegotiationSpec, PeerSpec, TunnelPeerSpec, TunnelSpec
from app.domain.tunnels import (
    Gateway,
    PeerEnd,
    TunnelRecord,
    TunnelState,
    gateway_capabilities,
    parse_traffic_selectors,
)
from app.services import idempotency as idem
from app.services.negotiation import run_negotiation
from app.services.tunnel_setup import bring_up, teardown

__all__ = [
    "Answer",
    "TunnelPage",
    "answer_of",
    "create_tunnel",
    "delete_tunnel",
    "every_tunnel",
    "keyed_tunnel_id",
    "negotiate_tunnel",
    "negotiation_inputs",
    "page_tunnels",
    "provenance",
    "request_peer",
    "request_tunnel",
    "result_from",
    "tunnel_status",
]


def negotiation_inputs(request: TunnelSpec) -> dict[str, Any]:
    """What of a tunnel request decides its negotiation, as a document (never the peer's PSK):
    kept in the record's provenance, so the tunnel can be negotiated again after an edit."""
    peer_supports = request.peer.supports if request.peer is not None else None
    return {
        "policy": request.policy,
        "min_levels": request.min_levels.stored() if request.min_levels is not None else None,
        "objective_id": request.objective_id,
        "objectives": list(request.objectives) if request.objectives is not None else None,
        "forbids": list(request.forbids),
        "rating_table": request.rating_table,
        "traffic": dataclasses.asdict(request.traffic) if request.traffic is not None else None,
        "strict": request.strict,
        "peer_supports": list(peer_supports) if peer_supports is not None else None,
    }


def request_peer(inputs: Mapping[str, Any]) -> PeerSpec:
    """The peer that states a tunnel request's own asks, from its inputs (:func:`negotiation_inputs`)."""
    objectives = inputs.get("objectives")
    return PeerSpec(
        name="request", policy=inputs.get("policy"),
        min_levels=Levels.from_dict(inputs["min_levels"]) if inputs.get("min_levels") is not None else None,
        objective_id=inputs.get("objective_id"), objectives=tuple(objectives) if objectives is not None else None,
        forbids=tuple(inputs.get("forbids") or ()), strict=inputs.get("strict"))


def negotiate_tunnel(
    *, uow: UnitOfWork, inputs: Mapping[str, Any], initiator: Gateway, responder: Gateway | None,
    default_table: str, pinned: Sequence[str] | None = None, check: bool = False,
) -> NegotiationResult:
    """Negotiate a tunnel between ``initiator`` and ``responder`` (None: an unmanaged peer) for
    the request ``inputs`` (:func:`negotiation_inputs`), each gateway's algorithms a peer's.

    ``pinned``: also only these algorithms (the suite a tunnel runs on), to ask whether that
    suite still meets the minimums: ``NoFeasibleSuite`` if it does not. ``check``: each table's
    revision read now (:func:`~app.services.negotiation.run_negotiation`).

    Raises:
        NoFeasibleSuite: nothing meets the minimums (409).
        UnsupportedProtection: the request asks for no IPsec.
    """
    peers = [PeerSpec(name=f"gw-{initiator.name}"[:64], supports=tuple(sorted(gateway_capabilities(initiator))))]
    if responder is not None:
        peers.append(PeerSpec(name=f"gw-{responder.name}"[:64],
                              supports=tuple(sorted(gateway_capabilities(responder)))))
    else:
        # What the unmanaged peer declared (else anything), never a post-quantum preshared key:
        # qoss cannot hand it one.
        declared = inputs.get("peer_supports")
        supports = tuple(declared) if declared is not None else tuple(CATALOGUE)
        peers.append(PeerSpec(name="peer", supports=tuple(k for k in supports if k != "ppk")))
    if pinned is not None:
        peers.append(PeerSpec(name="current-suite", supports=tuple(pinned)))
    peers.append(request_peer(inputs))
    traffic = inputs.get("traffic")
    body = NegotiationSpec(
        rating_table=inputs.get("rating_table"), peers=tuple(peers),
        traffic=TrafficProfile.from_dict(traffic) if traffic is not None else None,
        backend=Backend.of_ends([g.backend for g in (initiator, responder) if g is not None]))
    result = run_negotiation(uow=uow, request=body, default_table=default_table, check=check)
    if result.suite.protocol == "none":
        raise UnsupportedProtection("Objective-ID 1 (Native) asks for no IPsec: there is no tunnel to set up")
    return result


def provenance(*, uow: UnitOfWork, inputs: Mapping[str, Any], result: NegotiationResult, initiator: Gateway,
               responder: Gateway | None, recent: bool = False) -> dict[str, Any]:
    """What a tunnel was negotiated under: its request, each table's and the stored policy's
    revision at that moment, both ends' algorithms. With ``recent`` (the negotiation just read
    its tables through ``uow``) each table's revision is the one the negotiation used, normally
    no query; without, the database's current one."""
    names = sorted(set(result.tables.values()))
    tables = ({name: uow.tables.recent(name).revision for name in names} if recent
              else {name: uow.tables.current_revision(name) for name in names})
    policy = inputs.get("policy")
    return {
        "request": dict(inputs),
        "tables": tables,
        "policy_revision": uow.policies.current_revision(policy) if policy else None,
        "capabilities": {initiator.name: sorted(initiator.algorithms),
                         **({responder.name: sorted(responder.algorithms)} if responder is not None else {})},
    }


def _peer_end(peer: TunnelPeerSpec, initiator: Gateway, allowed_networks: Sequence[str],
              tunnels: TunnelStore) -> PeerEnd:
    try:
        ip = ipaddress.ip_address(peer.address)
    except ValueError as exc:
        raise InvalidInput(f"peer.address {peer.address[:45]!r} is not an IP address") from exc
    if not any(ip in ipaddress.ip_network(net) for net in allowed_networks):
        raise InvalidInput(f"peer.address {ip} is outside the allowed networks {list(allowed_networks)}")
    if str(ip) == initiator.ike_address:
        raise InvalidInput("peer.address is the initiator's own IKE address")
    end = PeerEnd(address=str(ip), identity=peer.identity or str(ip),
                  local_identity=peer.local_identity or initiator.identity)
    other = tunnels.joining(initiator.name, end.identity, end.local_identity)
    if other is not None:  # same identity pair, another PSK: charon could not tell which secret is meant
        raise Conflict(f"tunnel {other} already joins {initiator.name} to peer {end.identity} with these "
                       "identities: delete it first or use other identities")
    return end


def create_tunnel(
    *, uow: UnitOfWork, vici: ViciFactory, request: TunnelSpec, default_table: str,
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"), metrics: Metrics = NO_METRICS,
    tunnel_id: str | None = None, reads: UnitOfWork | None = None, reports: UpReports | None = None,
) -> TunnelRecord:
    """Negotiate, load the managed end(s), bring the tunnel up and verify it.

    ``metrics``: every attempt is counted by outcome (``qoss_tunnel_setups_total``: ``up`` or the
    error's name) and the strongSwan part timed (``qoss_tunnel_setup_seconds``).

    To a registered ``responder``: both ends loaded with a fresh PSK and verified. To an
    unmanaged ``peer`` (its address inside ``allowed_networks``): only the initiator is
    loaded, with the peer's write-only PSK, and verified. ``tunnel_id``: the new tunnel's id
    (default: a random one); a taken one is ``AlreadyExists`` and its conn is left alone.

    The negotiation reads through ``reads`` (a read-only unit of work; default ``uow``), and
    ``uow``'s transaction is ended before strongSwan is touched: it must hold nothing uncommitted.
    The record is committed before this returns (``uow.commit_with``: on SQLite in one
    transaction with the records of the set-ups that wait for the writer at the same time).

    ``reports``: charon's reports of SAs coming up, read instead of ``list-sas`` where they
    show exactly the expected algorithms (``app.services.tunnel_setup.bring_up``).

    Raises:
        InvalidInput: bad selectors, a peer address outside the allowed networks.
        Conflict: a tunnel to the same peer with the same identities exists.
        NoFeasibleSuite: nothing meets the minimums; nothing was loaded.
        GatewayUnreachable: a charon does not answer (503); everything loaded was unloaded.
        GatewayRejected: strongSwan refused, e.g. NO_PROPOSAL_CHOSEN or AUTHENTICATION_FAILED (502); likewise.
        TunnelVerificationFailed: strongSwan negotiated something else (502); likewise.
    """
    try:
        record = _create_tunnel(uow=uow, vici=vici, request=request, default_table=default_table,
                                allowed_networks=allowed_networks, metrics=metrics, tunnel_id=tunnel_id,
                                reads=reads or uow, reports=reports)
    except Exception as exc:
        metrics.count("qoss_tunnel_setups_total", outcome=error_label(exc))
        raise
    metrics.count("qoss_tunnel_setups_total", outcome="up")
    return record


@dataclass(frozen=True)
class _Plan:
    """What a tunnel set-up decided before strongSwan was touched, and what it decided it under."""

    initiator: Gateway
    responder: Gateway | None
    peer: PeerEnd | None
    local_ts: tuple[str, ...]
    remote_ts: tuple[str, ...]
    inputs: dict[str, Any]
    result: NegotiationResult
    origin: dict[str, Any]  # the provenance: table and policy revisions, both ends' algorithms


def _plan(*, uow: UnitOfWork, request: TunnelSpec, default_table: str, allowed_networks: Sequence[str],
          inputs: dict[str, Any] | None = None, check: bool = False) -> _Plan:
    if request.initiator == request.responder:
        raise InvalidInput("initiator and responder must be different gateways")
    found = uow.gateways.get_many([n for n in (request.initiator, request.responder) if n is not None])
    initiator = found[request.initiator]
    responder = found[request.responder] if request.responder is not None else None
    peer = None
    if request.peer is not None:
        peer = _peer_end(request.peer, initiator, allowed_networks, uow.tunnels)
    local_ts = parse_traffic_selectors(request.local_ts or list(initiator.inside_networks), "local_ts")
    remote_ts = parse_traffic_selectors(
        request.remote_ts or (list(responder.inside_networks) if responder is not None else []), "remote_ts")
    inputs = inputs if inputs is not None else negotiation_inputs(request)
    result = negotiate_tunnel(uow=uow, inputs=inputs, initiator=initiator, responder=responder,
                              default_table=default_table, check=check)
    # The tables' revisions the negotiation used: the record is kept (_still_right) only if they
    # are still current in the transaction that keeps it.
    origin = provenance(uow=uow, inputs=inputs, result=result, initiator=initiator, responder=responder, recent=True)
    return _Plan(initiator, responder, peer, local_ts, remote_ts, inputs, result, origin)


def _create_tunnel(
    *, uow: UnitOfWork, vici: ViciFactory, request: TunnelSpec, default_table: str,
    allowed_networks: Sequence[str], metrics: Metrics, tunnel_id: str | None, reads: UnitOfWork,
    reports: UpReports | None,
) -> TunnelRecord:
    plan = _plan(uow=reads, request=request, default_table=default_table,
                 allowed_networks=allowed_networks)
    # strongSwan's part takes most of a set-up: no transaction stays open through it (on SQLite
    # an open write transaction would make every other change wait for these charons).
    if reads is not uow:
        reads.rollback()
    uow.rollback()
    tunnel_id = tunnel_id or secrets.token_hex(6)
    far: Gateway | PeerEnd
    if plan.responder is not None:
        far = plan.responder
    else:
        assert plan.peer is not None  # TunnelSpec holds exactly one of them
        far = plan.peer
    psk = request.peer.psk.get_secret_value().encode() if request.peer is not None else None
    started = time.monotonic()
    try:
        bring_up(tunnel_id=tunnel_id, initiator=plan.initiator, far=far, local_ts=plan.local_ts,
                 remote_ts=plan.remote_ts, result=plan.result, vici=vici, psk=psk, reports=reports)
    except Exception as exc:
        metrics.observe("qoss_tunnel_setup_seconds", time.monotonic() - started, outcome=error_label(exc))
        raise
    metrics.observe("qoss_tunnel_setup_seconds", time.monotonic() - started, outcome="up")
    record = TunnelRecord(
        id=tunnel_id, initiator=plan.initiator.name, responder=plan.responder.name if plan.responder else None,
        local_ts=plan.local_ts, remote_ts=plan.remote_ts, state=TunnelState.UP,
        negotiation=plan.result.as_dict(), peer=plan.peer, provenance=plan.origin,
    )

    def keep(unit: UnitOfWork) -> TunnelRecord:
        kept = _still_right(uow=unit, request=request, default_table=default_table,
                            allowed_networks=allowed_networks, plan=plan, record=record)
        # Taken (AlreadyExists): this transaction is rolled back (commit_with runs the other
        # writers of its group again without it), so no savepoint is needed.
        stored = unit.tunnels.add(kept, keep_transaction=False)
        unit.events.append("tunnel.created", tunnel_id, {"state": "up", "suite": kept.negotiation["suite"],
                                                         "initiator": kept.initiator, "responder": kept.responder},
                           scope="tunnels:read")
        return stored

    try:
        return uow.commit_with(keep)
    except AlreadyExists:
        raise  # another request made this very tunnel (same id, same conn): it is theirs
    except BaseException:
        # The record could not be written: take the tunnel down again, leave nothing behind.
        teardown(record, plan.initiator, plan.responder, vici, strict=False)
        raise


def _still_right(*, uow: UnitOfWork, request: TunnelSpec, default_table: str, allowed_networks: Sequence[str],
                 plan: _Plan, record: TunnelRecord) -> TunnelRecord:
    """The record to keep for a tunnel brought up under ``plan``, read again in the transaction
    that keeps it. Unless a gateway, rating table or policy it depends on was edited while
    strongSwan was busy (or, to an unmanaged peer, another tunnel took its identities), that is
    ``record``. After such an edit the tunnel is negotiated again: if strongSwan would be given
    exactly what it was given, the record names the new negotiation; if not, ``Conflict``
    (the caller takes the tunnel down)."""
    try:
        found = uow.gateways.get_many([g.name for g in (plan.initiator, plan.responder) if g is not None])
        initiator = found[plan.initiator.name]
        responder = found[plan.responder.name] if plan.responder is not None else None
        if request.peer is not None:
            _peer_end(request.peer, initiator, allowed_networks, uow.tunnels)
        unchanged = (initiator, responder) == (plan.initiator, plan.responder) and plan.origin == provenance(
            uow=uow, inputs=plan.inputs, result=plan.result, initiator=initiator, responder=responder)
        if unchanged:
            return record
        # Each table's revision read now: a recent read may be from before the edit.
        now = _plan(uow=uow, check=True, request=request, default_table=default_table,
                    allowed_networks=allowed_networks, inputs=plan.inputs)
    except (NotFound, NoFeasibleSuite) as exc:
        raise Conflict(f"the tunnel's inputs changed while it was being set up ({exc.message}); "
                       "nothing was kept: retry") from exc
    if _loaded(now) != _loaded(plan):
        raise Conflict("a gateway, rating table or policy this tunnel depends on changed while it was being "
                       "set up, and it would now be negotiated differently; nothing was kept: retry")
    return dataclasses.replace(record, negotiation=now.result.as_dict(), provenance=now.origin)


def _loaded(plan: _Plan) -> tuple[Any, ...]:
    """What strongSwan is given for a plan: the ends and the proposals, mode and lifetimes."""
    r = plan.result
    ends = (plan.initiator.ike_address, plan.initiator.identity, plan.initiator.vici_socket) + (
        (plan.responder.ike_address, plan.responder.identity, plan.responder.vici_socket)
        if plan.responder is not None else ())
    return (ends, plan.peer, plan.local_ts, plan.remote_ts, r.suite, dict(r.proposals), r.mode, dict(r.lifetimes))


_TUNNEL_ID = re.compile(r"[a-z0-9-]{1,40}")


@dataclass(frozen=True)
class TunnelPage:
    """One page of a listing, and the cursor of the next one (None: this was the last)."""

    records: list[TunnelRecord]
    next_cursor: str | None


def _cursor(record: TunnelRecord) -> str:
    raw = f"{record.created_at}|{record.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after(cursor: str) -> tuple[str, str]:
    """The (created_at, id) a cursor of :func:`_cursor` stands for.

    Raises:
        InvalidInput: not a cursor this service gave.
    """
    try:
        stamp, _, tunnel_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition("|")
        when: datetime | None = datetime.fromisoformat(stamp)
        when = when.astimezone(UTC) if when is not None and when.tzinfo is not None else None
    except (ValueError, OverflowError):  # not base64, not UTF-8, not a time, out of range in UTC
        when, tunnel_id = None, ""
    if when is None or not _TUNNEL_ID.fullmatch(tunnel_id):
        raise InvalidInput("cursor: not one this service gave (take it from the Link header of the page before, "
                           "or start again without it)")
    return when.isoformat(), tunnel_id


def page_tunnels(*, uow: UnitOfWork, limit: int, cursor: str | None = None,
                 state: TunnelState | None = None) -> TunnelPage:
    """Up to ``limit`` tunnels, oldest first, from where ``cursor`` left off. A cursor stays
    valid when tunnels are made or deleted meanwhile: nothing is listed twice or skipped
    (a tunnel made meanwhile is on a later page)."""
    found = uow.tunnels.page(limit=limit + 1, after=_after(cursor) if cursor is not None else None, state=state)
    records = found[:limit]
    return TunnelPage(records, _cursor(records[-1]) if len(found) > limit else None)


def every_tunnel(units: UnitOfWorkFactory, *, page: int, state: TunnelState | None = None) -> Iterator[TunnelRecord]:
    """Every tunnel (only those in ``state``), oldest first, read ``page`` at a time, each page in a
    unit of work of its own: nothing is held between pages, and a tunnel made meanwhile comes last."""
    after: tuple[str, str] | None = None
    while True:
        with units() as uow:
            found = uow.tunnels.page(limit=page, after=after, state=state)
        yield from found
        if len(found) < page:
            return
        after = (found[-1].created_at or "", found[-1].id)


def tunnel_status(*, uow: UnitOfWork, vici: ViciFactory, tunnel_id: str) -> dict[str, Any]:
    """The record plus what the initiator's charon says now (state, bytes, algorithms)."""
    record = uow.tunnels.get(tunnel_id)
    out = record.as_dict()
    initiator = uow.gateways.get(record.initiator)
    try:
        sas = vici(initiator.vici_socket).list_sas(ike=record.conn)
    except GatewayError as exc:
        out["live"] = {"reachable": False, "error": exc.message}
        return out
    live: dict[str, Any] = {"reachable": True, "ike_state": None, "child_state": None}
    for sa in sas:
        if sa.name != record.conn:
            continue
        live.update(ike_state=sa.state, encr_alg=sa.encr_alg, integ_alg=sa.integ_alg, prf_alg=sa.prf_alg,
                    dh_group=sa.dh_group, ppk=sa.ppk)
        for child in sa.children:
            if child.name == record.conn:
                live.update(child_state=child.state, esp_encr_alg=child.encr_alg,
                            esp_encr_keysize=child.encr_keysize, esp_integ_alg=child.integ_alg,
                            bytes_in=child.bytes_in, bytes_out=child.bytes_out,
                            packets_in=child.packets_in, packets_out=child.packets_out)
    out["live"] = live
    return out


def delete_tunnel(*, uow: UnitOfWork, vici: ViciFactory, tunnel_id: str, reads: UnitOfWork | None = None) -> None:
    """Terminate the tunnel and unload conn and secret on both ends, then forget it.

    The record and its gateways are read through ``reads`` (a read-only unit of work; default
    ``uow``) and no transaction stays open while strongSwan works (on SQLite an open write
    transaction would make every other change wait for these charons); the record is deleted in
    a new transaction of ``uow``, which the caller commits. Deleting a tunnel another request has
    just deleted is ``NotFound`` (its conns are gone either way).

    Raises:
        NotFound: no such tunnel.
        GatewayUnreachable: a charon does not answer; the record stays, so the delete can be retried.
    """
    source = reads or uow
    record = source.tunnels.get(tunnel_id)
    gateways = source.gateways
    initiator = gateways.get(record.initiator)
    responder = gateways.get(record.responder) if record.responder is not None else None
    if reads is not None and reads is not uow:
        reads.rollback()
    uow.rollback()  # nothing is written yet: this ends the read, not a change
    teardown(record, initiator, responder, vici, strict=True)
    uow.tunnels.delete(tunnel_id)
    uow.events.append("tunnel.deleted", tunnel_id, {}, scope="tunnels:read")


def result_from(record: TunnelRecord) -> NegotiationResult:
    """The negotiation recorded at creation, as the engine's result type."""
    from app.domain.negotiation import Suite
    from app.domain.policies import Levels

    n = record.negotiation
    suite = n["suite"]
    return NegotiationResult(
        suite=Suite(suite["protocol"], suite["encryption"], suite["integrity"], suite["key_exchange"],
                    suite.get("aead", False), suite.get("post_quantum")),
        proposals=dict(n["proposals"]),
        levels=Levels(**n["levels"]),
        cost=n["cost"],
        cost_unit=n["cost_unit"],
        mode=n["mode"],
        lifetimes=dict(n["lifetimes"]),
        ike=dict(n["ike"]),
        alternatives=[],
        rejected=[],
        notes=list(n.get("notes", [])),
        requirement=dict(n.get("requirement", {})),
        tables=dict(n.get("tables", {})),
    )


@dataclass(frozen=True)
class Answer:
    """What a tunnel request answers: its status and document, and whether it is a replay."""

    status: int
    body: dict[str, Any]
    replayed: bool = False


def request_tunnel(
    *, uow: UnitOfWork, units: UnitOfWorkFactory, vici: ViciFactory, request: TunnelSpec,
    default_table: str, allowed_networks: Sequence[str], token_id: str, idempotency_key: str | None,
    fingerprint_key: bytes, lease: float, metrics: Metrics = NO_METRICS, reads: UnitOfWork | None = None,
    reports: UpReports | None = None,
) -> Answer:
    """:func:`create_tunnel` for a client, at most once per ``idempotency_key``.

    With a key, the key is reserved (in its own transaction, committed at once) before
    anything is loaded into a charon; a retry of the same request gets the first answer, a
    different request with the same key 422, one while the first still runs 409. The tunnel's
    record is committed (:func:`create_tunnel`) before the answer is stored under the key: the
    answer is never remembered for a tunnel whose record did not commit. On any failure ``uow``
    is rolled back (releasing its write lock) and then the key, so the client can retry.

    A keyed request's tunnel id is derived from the token and the key (:func:`keyed_tunnel_id`),
    so that every attempt of one request makes the same tunnel: a retry after the process
    running the first attempt died (its claim older than ``lease`` seconds) finds the tunnel
    if that attempt got as far as its record, and answers it instead of making a second one;
    if not, the retry's conn replaces whatever that attempt had loaded.
    """
    tunnel_id = None
    if idempotency_key is not None:
        stored = idem.begin(units, token_id=token_id, key=idempotency_key,
                            digest=idem.fingerprint(request, key=fingerprint_key), lease=lease)
        if stored is not None:
            return Answer(stored.status, stored.body, replayed=True)
        tunnel_id = keyed_tunnel_id(fingerprint_key, token_id, idempotency_key)
        try:
            earlier = uow.tunnels.get(tunnel_id)
        except NotFound:
            pass
        else:  # an attempt whose process died after its record committed, before it was answered
            body = answer_of(earlier)
            uow.rollback()  # nothing to write here; ends the transaction (SQLite: its lock) first
            idem.complete(units, token_id=token_id, key=idempotency_key, status=201, body=body)
            return Answer(201, body, replayed=True)
    try:
        record = create_tunnel(uow=uow, vici=vici, request=request, default_table=default_table,
                               allowed_networks=allowed_networks, metrics=metrics, tunnel_id=tunnel_id, reads=reads,
                               reports=reports)  # committed
        body = answer_of(record)
    except BaseException as exc:
        uow.rollback()
        if idempotency_key is not None:
            idem.abandon(units, token_id=token_id, key=idempotency_key)
            if isinstance(exc, AlreadyExists):  # a live earlier attempt won the race: it answers
                raise idem.IdempotencyInProgress("a request with this Idempotency-Key is in progress") from exc
        raise
    if idempotency_key is not None:
        idem.complete(units, token_id=token_id, key=idempotency_key, status=201, body=body)
    return Answer(201, body)


def keyed_tunnel_id(secret: bytes, token_id: str, key: str) -> str:
    """The tunnel id of every attempt of one keyed request: 12 hex digits (like a random id) of
    an HMAC of the token and the key under the database's own ``secret``, so an id tells
    nothing of the key and no other client can aim at it."""
    return hmac.new(secret, f"tunnel\0{token_id}\0{key}".encode(), hashlib.sha256).hexdigest()[:12]


def answer_of(record: TunnelRecord) -> dict[str, Any]:
    """What a tunnel request answers of the tunnel made."""
    return {**record.as_dict(), "ike": record.negotiation.get("ike"), "notes": record.negotiation.get("notes")}
