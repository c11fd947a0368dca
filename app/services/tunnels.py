"""Gateways and tunnels: make a negotiated suite real in strongSwan, and undo it.

Changing strongSwan follows stage -> verify -> commit or roll back: the responder's
secret and conn are loaded, then the initiator's, the initiator initiates, and both
ends' ``list-sas`` must show exactly the chosen algorithms. Any failure on the way
unloads everything that was loaded, on both ends, before the error reaches the caller.
The PSK is 32 fresh random bytes per tunnel, handed to charon and otherwise forgotten:
never stored, logged or returned.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import secrets
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from sqlalchemy.orm import Session

from app.adapters.db.repositories import GatewayRepository, TunnelRepository
from app.adapters.vici.driver import ViciGateway
from app.adapters.vici.models import IkeSa
from app.domain.errors import (
    Conflict,
    GatewayError,
    GatewayRejected,
    InvalidInput,
    NotFound,
    TunnelVerificationFailed,
    UnsupportedProtection,
)
from app.domain.negotiation import NegotiationResult
from app.domain.tunnels import (
    Gateway,
    ObservedSa,
    PeerEnd,
    TunnelEnd,
    TunnelRecord,
    TunnelState,
    conn_name,
    conn_payload,
    expected_sa,
    is_tunnel_conn,
    keywords_from_charon,
    mismatches,
    parse_traffic_selectors,
)
from app.services.negotiation import BackendIn, MinLevelsIn, NegotiationIn, PeerIn, TrafficIn, run_negotiation
from app.services.ratings import TableCache

__all__ = [
    "GatewayIn",
    "ReconcileReport",
    "TunnelIn",
    "TunnelPeerIn",
    "ViciFactory",
    "create_tunnel",
    "delete_gateway",
    "delete_tunnel",
    "established_everywhere",
    "get_gateway",
    "list_gateways",
    "list_tunnels",
    "reconcile",
    "refresh_gateway",
    "register_gateway",
    "tunnel_status",
]

log = logging.getLogger("qoss.tunnels")

ViciFactory = Callable[[str], ViciGateway]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Keyword = Annotated[str, Field(min_length=1, max_length=64)]
Cidr = Annotated[str, Field(min_length=1, max_length=64)]
_INITIATE_TIMEOUT_MS = 15_000
#: Runs a tunnel's independent VICI calls (the two loads of one side, the two list-sas)
#: concurrently: each is a separate UNIX-socket connection to a charon.
_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="qoss-vici")


class _Strict(BaseModel):
    """Unknown fields refused; no coercion: a level is an int, not ``true`` or ``"8"``, a flag a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GatewayIn(_Strict):
    """A strongSwan instance to drive."""

    name: Name
    vici_socket: Annotated[str, Field(min_length=2, max_length=107, pattern=r"^/[A-Za-z0-9_./-]+$")]
    ike_address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")] | None = None
    inside_networks: Annotated[list[Cidr], Field(min_length=1, max_length=16)]


Identity = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]*$")]


class TunnelPeerIn(_Strict):
    """An unmanaged far end: an IKEv2 gateway qoss does not drive, set up by its own administrator.

    Its administrator configures it with ``psk``, its own ``identity`` and qoss's
    ``local_identity`` (and the proposals qoss answers with). The PSK is write-only: it
    is handed to the managed gateway's charon and otherwise forgotten — never stored,
    logged or returned, so a peer tunnel cannot be restored by reconcile (it is marked
    ``failed``; create it again).
    """

    address: Annotated[str, Field(min_length=2, max_length=45)]
    identity: Identity | None = Field(default=None, description="the peer's IKE identity (default: its address)")
    local_identity: Identity | None = Field(
        default=None, description="the managed gateway's IKE identity towards this peer (default: the gateway's)")
    psk: SecretStr = Field(min_length=32, max_length=256,
                           description="pre-shared key, 32-256 printable characters; write-only")
    supports: Annotated[list[Keyword], Field(max_length=200)] | None = Field(
        default=None, description="algorithms the peer declares (default: judged by the managed gateway alone)")

    @field_validator("psk")
    @classmethod
    def _psk_shape(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if not 32 <= len(raw) <= 256 or not raw.isascii() or not raw.isprintable():
            # Never echo the value: the message names the rule only.
            raise ValueError("psk must be 32-256 printable ASCII characters")
        return value


class TunnelIn(_Strict):
    """A tunnel from a registered gateway to another one (``responder``) or to an unmanaged ``peer``."""

    initiator: Name
    responder: Name | None = None
    peer: TunnelPeerIn | None = None
    local_ts: Annotated[list[Cidr], Field(min_length=1, max_length=16)] | None = None
    remote_ts: Annotated[list[Cidr], Field(min_length=1, max_length=16)] | None = None
    policy: Name | None = None
    min_levels: MinLevelsIn | None = None
    objective_id: Annotated[int, Field(ge=1, le=4)] | None = None
    objectives: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=16)] | None = None
    forbids: Annotated[list[Keyword], Field(max_length=200)] = []
    rating_table: Name | None = None
    traffic: TrafficIn | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _one_far_end(self) -> TunnelIn:
        if (self.responder is None) == (self.peer is None):
            raise ValueError("give exactly one of responder (a registered gateway) or peer (an unmanaged one)")
        if self.peer is not None and not self.remote_ts:
            raise ValueError("a tunnel to a peer needs remote_ts: qoss does not know the peer's networks")
        return self


# --------------------------------------------------------------------------- gateways


def _check_socket(path: str, allowed: Sequence[Path]) -> None:
    resolved = Path(path)
    if ".." in resolved.parts or not any(resolved.is_relative_to(d) for d in allowed):
        raise InvalidInput(f"vici_socket must be under one of {[str(d) for d in allowed]}")


def _read_capabilities(gateway: Gateway, vici: ViciFactory) -> Gateway:
    v = vici(gateway.vici_socket)
    version = v.version()
    stats = v.stats()
    algorithms = keywords_from_charon(v.get_algorithms().as_sections())
    return Gateway(
        name=gateway.name,
        vici_socket=gateway.vici_socket,
        ike_address=gateway.ike_address,
        identity=gateway.identity,
        inside_networks=gateway.inside_networks,
        backend=stats.backend,
        version=f"{version.daemon} {version.version}",
        algorithms=algorithms,
    )


def register_gateway(
    *, session: Session, vici: ViciFactory, body: GatewayIn, allowed_socket_dirs: Sequence[Path],
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"),
) -> Gateway:
    """Register a charon: its back end and algorithms are read from it over VICI.

    Raises:
        InvalidInput: a bad address, network or socket path.
        GatewayUnreachable: charon does not answer on the socket (nothing is stored).
        AlreadyExists: a gateway of that name exists.
    """
    _check_socket(body.vici_socket, allowed_socket_dirs)
    try:
        address = str(ipaddress.ip_address(body.ike_address))
    except ValueError as exc:
        raise InvalidInput(f"ike_address {body.ike_address[:45]!r} is not an IP address") from exc
    ip = ipaddress.ip_address(address)
    if not any(ip in ipaddress.ip_network(net) for net in allowed_networks):
        raise InvalidInput(f"ike_address {address} is outside the allowed networks {list(allowed_networks)}")
    gateway = Gateway(
        name=body.name,
        vici_socket=body.vici_socket,
        ike_address=address,
        identity=body.identity or f"{body.name}.qoss",
        inside_networks=parse_traffic_selectors(body.inside_networks, "inside_networks"),
    )
    gateway = _read_capabilities(gateway, vici)
    GatewayRepository(session).create(gateway)
    return gateway


def refresh_gateway(*, session: Session, vici: ViciFactory, name: str) -> Gateway:
    """Read a gateway's back end and algorithms again."""
    repo = GatewayRepository(session)
    gateway = _read_capabilities(repo.get(name), vici)
    repo.update(gateway)
    return gateway


def list_gateways(*, session: Session) -> list[Gateway]:
    return GatewayRepository(session).list()


def get_gateway(*, session: Session, name: str) -> Gateway:
    return GatewayRepository(session).get(name)


def delete_gateway(*, session: Session, name: str) -> None:
    """Forget a gateway; refused while tunnels use it."""
    in_use = [t.id for t in TunnelRepository(session).list() if name in (t.initiator, t.responder)]
    if in_use:
        raise Conflict(f"gateway {name} carries tunnels {in_use[:10]}: delete them first")
    GatewayRepository(session).delete(name)


def forget_gateways(*, session: Session, names: Sequence[str]) -> None:
    """Drop the records of these gateways and of every tunnel using one of them (a lab or a
    bench run that is gone); charon's own state is not touched. Unknown names are skipped."""
    repo = TunnelRepository(session)
    for t in repo.list():
        if t.initiator in names or t.responder in names:
            repo.delete(t.id)
    for name in names:
        with contextlib.suppress(NotFound):
            GatewayRepository(session).delete(name)


# --------------------------------------------------------------------------- tunnels


def _backend(gateways: Sequence[Gateway]) -> BackendIn:
    if any(g.backend == "kernel-libipsec" for g in gateways):
        return BackendIn(name="kernel-libipsec", ah=False, ah_esp_bundle=False, transport=False)
    return BackendIn(name=gateways[0].backend or "strongswan", ah=True, ah_esp_bundle=False, transport=True)


def _negotiate_for(
    *, session: Session, cache: TableCache, request: TunnelIn, initiator: Gateway, responder: Gateway | None,
    default_table: str,
) -> NegotiationResult:
    peers = [PeerIn(name=f"gw-{initiator.name}"[:64], supports=sorted(initiator.algorithms))]
    if responder is not None:
        peers.append(PeerIn(name=f"gw-{responder.name}"[:64], supports=sorted(responder.algorithms)))
    elif request.peer is not None and request.peer.supports is not None:
        peers.append(PeerIn(name="peer", supports=request.peer.supports))
    peers.append(
        PeerIn(
            name="request",
            policy=request.policy,
            min_levels=request.min_levels,
            objective_id=request.objective_id,
            objectives=request.objectives,
            forbids=request.forbids,
            strict=request.strict,
        )
    )
    body = NegotiationIn(rating_table=request.rating_table, peers=peers, traffic=request.traffic,
                         backend=_backend([initiator] if responder is None else [initiator, responder]))
    result = run_negotiation(session=session, cache=cache, request=body, default_table=default_table)
    if result.suite.protocol == "none":
        raise UnsupportedProtection("Objective-ID 1 (Native) asks for no IPsec: there is no tunnel to set up")
    return result


def _ends(tunnel_id: str, initiator: Gateway, far: Gateway | PeerEnd, local_ts: tuple[str, ...],
          remote_ts: tuple[str, ...]) -> tuple[TunnelEnd, TunnelEnd]:
    if isinstance(far, PeerEnd):  # identities the peer's administrator configured
        return (TunnelEnd(initiator.ike_address, far.local_identity, local_ts),
                TunnelEnd(far.address, far.identity, remote_ts))
    # Identities are per tunnel, so each tunnel's PSK is the only one matching its pair.
    left = TunnelEnd(initiator.ike_address, f"{tunnel_id}.{initiator.identity}", local_ts)
    right = TunnelEnd(far.ike_address, f"{tunnel_id}.{far.identity}", remote_ts)
    return left, right


def _observed(sas: Sequence[IkeSa], name: str) -> ObservedSa | None:
    for sa in sas:
        if sa.name != name:
            continue
        child = next((c for c in sa.children if c.name == name), None)
        return ObservedSa(
            ike_state=sa.state,
            ike_encr=sa.encr_alg,
            ike_encr_keysize=sa.encr_keysize,
            ike_integ=sa.integ_alg,
            ike_prf=sa.prf_alg,
            ike_dh=sa.dh_group,
            child_state=child.state if child else None,
            child_protocol=child.protocol if child else None,
            child_encr=child.encr_alg if child else None,
            child_encr_keysize=child.encr_keysize if child else None,
            child_integ=child.integ_alg if child else None,
        )
    return None


def _rollback(name: str, initiator: ViciGateway, responder: ViciGateway | None,
              loaded: list[tuple[str, ViciGateway]]) -> None:
    """Undo a partial set-up: terminate, then unload every conn and secret that was loaded."""
    for v in (initiator, responder):
        if v is not None:
            with contextlib.suppress(GatewayError, ValueError):
                v.terminate(ike=name, timeout_ms=3000, force=True)
    for what, v in reversed(loaded):
        try:
            if what == "conn":
                v.unload_conn(name)
            else:
                v.unload_shared(name)
        except GatewayError as exc:
            log.warning("rollback of %s %s on %s failed: %s", what, name, v.socket_path, exc.message)


def _bring_up(
    *, tunnel_id: str, initiator: Gateway, far: Gateway | PeerEnd, local_ts: tuple[str, ...],
    remote_ts: tuple[str, ...], result: NegotiationResult, vici: ViciFactory, psk: bytes | None = None,
) -> None:
    """Load, initiate, verify; on any failure unload what was loaded (stage -> verify -> commit).

    ``far`` is a managed gateway (both ends loaded and verified, fresh PSK) or an unmanaged
    peer (only the initiator loaded and verified, with the peer's write-only ``psk``).
    """
    name = conn_name(tunnel_id)
    v_init = vici(initiator.vici_socket)
    v_resp = None if isinstance(far, PeerEnd) else vici(far.vici_socket)
    left, right = _ends(tunnel_id, initiator, far, local_ts, remote_ts)
    ike_proposal = result.proposals["ike"]
    assert ike_proposal is not None
    if psk is None:
        psk = secrets.token_bytes(32)
    loaded: list[tuple[str, ViciGateway]] = []
    try:
        # Both ends' secrets and conns are independent of each other and nothing starts
        # before ``initiate`` (start_action none), so all four loads go at once.
        steps: list[tuple[str, ViciGateway, Callable[[], None]]] = []
        ends = [(v_init, left, right)] if v_resp is None else [(v_resp, right, left), (v_init, left, right)]
        for v, local, remote in ends:
            conn = conn_payload(
                name=name, local=local, remote=remote, ike_proposal=ike_proposal,
                esp_proposal=result.proposals["esp"], ah_proposal=result.proposals["ah"], mode=result.mode,
                ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"],
            )
            owners = [local.identity, remote.identity]
            steps += [("shared", v, partial(v.load_shared, name, psk, owners=owners)),
                      ("conn", v, partial(v.load_conn, name, conn))]
        _together(loaded, steps)
        v_init.initiate(child=name, ike=name, timeout_ms=_INITIATE_TIMEOUT_MS)
        expected = expected_sa(ike=result.ike, protocol=result.suite.protocol,
                               encryption=result.suite.encryption, integrity=result.suite.integrity)
        sides = [(v_init, initiator.name)]
        if v_resp is not None:
            sides.append((v_resp, str(getattr(far, "name", "responder"))))
        observed_sas = list(_POOL.map(lambda side: side[0].list_sas(ike=name), sides))
        for (_, side_name), sas in zip(sides, observed_sas, strict=True):
            observed = _observed(sas, name)
            if observed is None:
                raise TunnelVerificationFailed(f"{side_name}: no IKE_SA {name} after initiate")
            wrong = mismatches(expected, observed)
            if wrong:
                raise TunnelVerificationFailed(f"{side_name}: " + "; ".join(wrong))
    except BaseException:
        _rollback(name, v_init, v_resp, loaded)
        raise


def _together(loaded: list[tuple[str, ViciGateway]],
              steps: Sequence[tuple[str, ViciGateway, Callable[[], None]]]) -> None:
    """Run independent VICI loads concurrently; record each that succeeded; re-raise the first failure."""
    futures = [(what, v, _POOL.submit(fn)) for what, v, fn in steps]
    first: BaseException | None = None
    for what, v, future in futures:
        try:
            future.result()
        except BaseException as exc:
            first = first or exc
        else:
            loaded.append((what, v))
    if first is not None:
        raise first


def _peer_end(peer: TunnelPeerIn, initiator: Gateway, allowed_networks: Sequence[str],
              existing: Sequence[TunnelRecord]) -> PeerEnd:
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
    for other in existing:
        if other.initiator == initiator.name and other.peer is not None \
                and (other.peer.identity, other.peer.local_identity) == (end.identity, end.local_identity):
            # Same identity pair, another PSK: charon could not tell which secret is meant.
            raise Conflict(f"tunnel {other.id} already joins {initiator.name} to peer {end.identity} with these "
                           "identities: delete it first or use other identities")
    return end


def create_tunnel(
    *, session: Session, cache: TableCache, vici: ViciFactory, request: TunnelIn, default_table: str,
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"),
) -> TunnelRecord:
    """Negotiate, load the managed end(s), bring the tunnel up and verify it.

    To a registered ``responder``: both ends loaded with a fresh PSK and verified. To an
    unmanaged ``peer`` (its address inside ``allowed_networks``): only the initiator is
    loaded, with the peer's write-only PSK, and verified.

    Raises:
        InvalidInput: bad selectors, a peer address outside the allowed networks.
        Conflict: a tunnel to the same peer with the same identities exists.
        NoFeasibleSuite: nothing meets the minimums; nothing was loaded.
        GatewayUnreachable: a charon does not answer (503); everything loaded was unloaded.
        GatewayRejected: strongSwan refused, e.g. NO_PROPOSAL_CHOSEN or AUTHENTICATION_FAILED (502); likewise.
        TunnelVerificationFailed: strongSwan negotiated something else (502); likewise.
    """
    if request.initiator == request.responder:
        raise InvalidInput("initiator and responder must be different gateways")
    gateways = GatewayRepository(session)
    initiator = gateways.get(request.initiator)
    responder = gateways.get(request.responder) if request.responder is not None else None
    peer = None
    if request.peer is not None:
        peer = _peer_end(request.peer, initiator, allowed_networks, TunnelRepository(session).list())
    local_ts = parse_traffic_selectors(request.local_ts or list(initiator.inside_networks), "local_ts")
    remote_ts = parse_traffic_selectors(
        request.remote_ts or (list(responder.inside_networks) if responder is not None else []), "remote_ts")
    result = _negotiate_for(session=session, cache=cache, request=request, initiator=initiator,
                            responder=responder, default_table=default_table)
    tunnel_id = secrets.token_hex(6)
    far: Gateway | PeerEnd
    if responder is not None:
        far = responder
    else:
        assert peer is not None  # TunnelIn asks for exactly one of them
        far = peer
    psk = request.peer.psk.get_secret_value().encode() if request.peer is not None else None
    _bring_up(tunnel_id=tunnel_id, initiator=initiator, far=far, local_ts=local_ts,
              remote_ts=remote_ts, result=result, vici=vici, psk=psk)
    record = TunnelRecord(
        id=tunnel_id, initiator=initiator.name, responder=responder.name if responder is not None else None,
        local_ts=local_ts, remote_ts=remote_ts, state=TunnelState.UP, negotiation=result.as_dict(), peer=peer,
    )
    try:
        return TunnelRepository(session).add(record)
    except BaseException:
        # The record could not be written: take the tunnel down again, leave nothing behind.
        _teardown(record, initiator, responder, vici, strict=False)
        raise


def list_tunnels(*, session: Session) -> list[TunnelRecord]:
    return TunnelRepository(session).list()


def tunnel_status(*, session: Session, vici: ViciFactory, tunnel_id: str) -> dict[str, Any]:
    """The record plus what the initiator's charon says now (state, bytes, algorithms)."""
    record = TunnelRepository(session).get(tunnel_id)
    out = record.as_dict()
    initiator = GatewayRepository(session).get(record.initiator)
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
                    dh_group=sa.dh_group)
        for child in sa.children:
            if child.name == record.conn:
                live.update(child_state=child.state, esp_encr_alg=child.encr_alg,
                            esp_encr_keysize=child.encr_keysize, esp_integ_alg=child.integ_alg,
                            bytes_in=child.bytes_in, bytes_out=child.bytes_out,
                            packets_in=child.packets_in, packets_out=child.packets_out)
    out["live"] = live
    return out


def _teardown(record: TunnelRecord, initiator: Gateway, responder: Gateway | None, vici: ViciFactory,
              *, strict: bool) -> None:
    """Terminate and unload conn and secret on both ends; ``strict`` re-raises unreachable charons.

    Unloads directly (no listing first, which would make tearing down n tunnels cost
    O(n^2)); charon answering "not found" means it is already gone.
    """
    name = record.conn
    errors: list[GatewayError] = []
    for gw in (initiator, responder):
        if gw is None:  # an unmanaged peer: its administrator's to undo
            continue
        v = vici(gw.vici_socket)
        try:
            with contextlib.suppress(GatewayRejected):  # "no matching SAs": nothing up
                v.terminate(ike=name, timeout_ms=3000, force=True)
            try:
                v.unload_conn(name)
            except GatewayRejected as exc:
                if "not found" not in exc.message:
                    raise
            v.unload_shared(name)
        except GatewayError as exc:
            errors.append(exc)
    if errors and strict:
        raise errors[0]


def delete_tunnel(*, session: Session, vici: ViciFactory, tunnel_id: str) -> None:
    """Terminate the tunnel and unload conn and secret on both ends, then forget it.

    Raises:
        GatewayUnreachable: a charon does not answer; the record stays, so the delete can be retried.
    """
    tunnels = TunnelRepository(session)
    record = tunnels.get(tunnel_id)
    gateways = GatewayRepository(session)
    responder = gateways.get(record.responder) if record.responder is not None else None
    _teardown(record, gateways.get(record.initiator), responder, vici, strict=True)
    tunnels.delete(tunnel_id)


# --------------------------------------------------------------------------- reconcile


@dataclass
class ReconcileReport:
    """What reconciliation found and did."""

    healthy: list[str]
    restored: list[str]
    failed: dict[str, str]
    orphans_removed: list[str]
    unreachable: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "restored": self.restored,
            "failed": self.failed,
            "orphans_removed": self.orphans_removed,
            "unreachable": self.unreachable,
        }


def reconcile(*, session: Session, cache: TableCache, vici: ViciFactory, default_table: str) -> ReconcileReport:
    """Make charon and the records agree (documented in the README).

    - A tunnel whose conn is loaded and whose SA is ESTABLISHED on both ends: healthy.
    - A tunnel missing from either charon (e.g. charon restarted): restored with a fresh
      PSK and the suite recorded at creation, re-verified; if that fails it is marked
      ``failed`` with the reason (its partial configuration is removed).
    - A ``qoss-*`` conn or secret on a charon with no record: an orphan of a crash
      part-way, unloaded. The tunnel agent's ``qoss-agent-*`` ones are not this service's
      (the agent shares the charons and reconciles its own).
    - A tunnel to an unmanaged peer that is no longer established: its remains on the
      gateway are removed and it is marked ``failed`` (its PSK was never kept).
    - A gateway that does not answer: its tunnels are left as they are and reported.
    """
    report = ReconcileReport([], [], {}, [], {})
    gateways = {g.name: g for g in GatewayRepository(session).list()}
    tunnels = TunnelRepository(session)
    records = tunnels.list()
    known = {r.conn for r in records}
    conns: dict[str, set[str]] = {}
    for name, gw in gateways.items():
        v = vici(gw.vici_socket)
        try:
            conns[name] = set(v.list_conns())
            shared = set(v.get_shared())
        except GatewayError as exc:
            report.unreachable[name] = exc.message
            continue
        for orphan in sorted({c for c in conns[name] | shared if is_tunnel_conn(c)} - known):
            with contextlib.suppress(GatewayRejected, ValueError):
                v.terminate(ike=orphan, timeout_ms=3000, force=True)
            with contextlib.suppress(GatewayRejected):
                if orphan in conns[name]:
                    v.unload_conn(orphan)
            with contextlib.suppress(GatewayRejected):
                if orphan in shared:
                    v.unload_shared(orphan)
            report.orphans_removed.append(f"{name}:{orphan}")
    for record in records:
        initiator = gateways.get(record.initiator)
        responder = gateways.get(record.responder) if record.responder is not None else None
        if initiator is None or (record.peer is None and responder is None) \
                or record.initiator in report.unreachable or record.responder in report.unreachable:
            continue
        managed = [record.initiator] if record.responder is None else [record.initiator, record.responder]
        present = all(record.conn in conns.get(side, set()) for side in managed)
        if present and _established(vici, initiator, record.conn):
            report.healthy.append(record.id)
            if record.state is not TunnelState.UP:
                tunnels.set_state(record.id, TunnelState.UP, "")
            continue
        _teardown(record, initiator, responder, vici, strict=False)
        if record.peer is not None:
            # The peer's PSK is write-only (never stored), so this tunnel cannot be rebuilt.
            reason = "the tunnel to an unmanaged peer is gone and its PSK is not kept: create it again"
            report.failed[record.id] = reason
            tunnels.set_state(record.id, TunnelState.FAILED, f"reconcile: {reason}")
            continue
        assert responder is not None
        result = _result_from(record)
        try:
            _bring_up(tunnel_id=record.id, initiator=initiator, far=responder, local_ts=record.local_ts,
                      remote_ts=record.remote_ts, result=result, vici=vici)
        except GatewayError as exc:
            report.failed[record.id] = exc.message
            tunnels.set_state(record.id, TunnelState.FAILED, f"reconcile: {exc.message}"[:500])
            continue
        report.restored.append(record.id)
        tunnels.set_state(record.id, TunnelState.UP, "restored by reconcile")
    return report


def established_everywhere(vici: ViciFactory, gateways: Sequence[Gateway], name: str) -> bool:
    """Whether conn ``name``'s IKE_SA is ESTABLISHED with its CHILD_SA INSTALLED on every gateway.

    Raises:
        GatewayUnreachable: a charon does not answer (nothing can be said).
    """
    for gateway in gateways:
        observed = _observed(vici(gateway.vici_socket).list_sas(ike=name), name)
        if observed is None or observed.ike_state != "ESTABLISHED" or observed.child_state != "INSTALLED":
            return False
    return True


def _established(vici: ViciFactory, gateway: Gateway, name: str) -> bool:
    """As :func:`established_everywhere` on one gateway; an unreachable charon counts as not established."""
    try:
        return established_everywhere(vici, [gateway], name)
    except GatewayError:
        return False


def _result_from(record: TunnelRecord) -> NegotiationResult:
    """The negotiation recorded at creation, as the engine's result type."""
    from app.domain.negotiation import Suite
    from app.domain.policies import Levels

    n = record.negotiation
    suite = n["suite"]
    return NegotiationResult(
        suite=Suite(suite["protocol"], suite["encryption"], suite["integrity"], suite["key_exchange"],
                    suite.get("aead", False)),
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
