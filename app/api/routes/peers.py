"""Peers: other qoss services this one negotiates tunnels with (``QOSS_PEER_NAME`` set).

An administrator reads this side's identity (``GET /v1/peering/identity``), gives it to the
other side's administrator out of band, and registers the other side (``POST /v1/peers``) with
its identity, the gateways and networks of this side it may ask for, and the minimum levels
this side demands of any tunnel with it. Peers talk to each other on ``POST
/v1/peering/messages``: anonymous at the HTTP level, every message signed and sealed, from a
registered peer only, fresh and never replayed.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field, field_validator

from app.adapters.agent.crypto import PublicKeys
from app.domain.errors import InvalidInput, NotFound
from app.domain.peering import Peer, PeerState, valid_peer_name
from app.domain.policies import Levels
from app.services.peering import Peering
from app.web.deps import UnitDep, in_worker_thread, reader, require
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import Cidr, MinLevelsIn, Name, Strict, error_responses

__all__ = ["router"]

router = APIRouter(tags=["peers"], route_class=QossRoute)
_WRITE = [Depends(require("peers:write"))]
_READ = [Depends(reader)]
_ERRORS = error_responses(404, 409, 422)
#: The largest message a peer may send.
_MAX_MESSAGE = 64 * 1024


class PeerIn(Strict):
    """A peer to register: its name (as it calls itself), URL and public keys, and what it may ask of this side."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    url: Annotated[str, Field(min_length=8, max_length=255)]
    sign_public_key: Annotated[str, Field(min_length=43, max_length=43)]
    kem_public_key: Annotated[str, Field(min_length=43, max_length=43)]
    gateways: Annotated[list[Name], Field(min_length=1, max_length=16)]
    networks: Annotated[list[Cidr], Field(min_length=1, max_length=16)]
    min_levels: MinLevelsIn | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
                or parts.username or parts.password:
            raise ValueError("an http(s) URL with a host, no query, fragment or user")
        return value.rstrip("/")

    @field_validator("networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        try:
            return [str(ipaddress.ip_network(n, strict=False)) for n in value]
        except ValueError as exc:
            raise ValueError(f"not a network: {exc}") from exc


class PeerStateIn(Strict):
    """A peering's new state: ``active``, ``suspended`` (no new tunnels) or ``revoked`` (its tunnels end)."""

    state: Literal["active", "suspended", "revoked"]


def _out(peer: Peer) -> dict[str, Any]:
    return {"name": peer.name, "url": peer.url, **PublicKeys(peer.sign_key, peer.kem_key).as_dict(),
            "gateways": list(peer.gateways), "networks": list(peer.networks),
            "min_levels": peer.min_levels.as_dict(), "state": peer.state.value,
            "created_at": peer.created_at, "updated_at": peer.updated_at}


def _peering(request: Request) -> Peering:
    peering = runtime(request).peering
    if peering is None:
        raise NotFound("this service has no peers: set QOSS_PEER_NAME to take part in peering")
    return peering


@router.get("/peering/identity", dependencies=_WRITE, responses=_ERRORS)
async def identity(request: Request) -> dict[str, str]:
    """This side's name and public keys: what the other side's administrator registers."""
    return await in_worker_thread(_peering(request).identity)


@router.post("/peers", dependencies=_WRITE, status_code=201, responses=_ERRORS)
def register_peer(body: PeerIn, request: Request, uow: UnitDep) -> dict[str, Any]:
    """Register a peer (both sides register each other). Its gateways must be this side's."""
    _peering(request)
    if not valid_peer_name(body.name):
        raise InvalidInput("a peer's name is 1-63 of a-z, 0-9, '.', '_', '-'")
    keys = PublicKeys.from_text(body.sign_public_key, body.kem_public_key)
    try:  # a key no message can be sealed to (a low-order point) is no key
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(keys.kem))
    except ValueError as exc:
        raise InvalidInput("kem_public_key is not an X25519 key a message can be sealed to") from exc
    for name in body.gateways:
        uow.gateways.get(name)  # NotFound: only this side's own gateways
    levels = Levels.from_dict(body.min_levels.model_dump(exclude_none=True) if body.min_levels else None)
    peer = uow.peers.create(Peer(name=body.name, url=body.url, sign_key=keys.sign, kem_key=keys.kem,
                                 gateways=tuple(body.gateways), networks=tuple(body.networks), min_levels=levels))
    uow.events.append("peer.registered", peer.name, {"url": peer.url}, scope="tunnels:read")
    return _out(peer)


@router.get("/peers", dependencies=_READ, responses=_ERRORS)
def list_peers(request: Request, uow: UnitDep) -> list[dict[str, Any]]:
    """Every registered peer."""
    _peering(request)
    return [_out(p) for p in uow.peers.list()]


@router.get("/peers/{name}", dependencies=_READ, responses=_ERRORS)
def get_peer(name: Name, request: Request, uow: UnitDep) -> dict[str, Any]:
    """One peer."""
    _peering(request)
    return _out(uow.peers.get(name))


@router.patch("/peers/{name}", dependencies=_WRITE, responses=_ERRORS)
def set_peer_state(name: Name, body: PeerStateIn, request: Request, uow: UnitDep) -> dict[str, Any]:
    """Suspend (no new tunnels; running ones stay), resume, or revoke (every tunnel it carries
    ends, on both sides) a peering."""
    return _out(_peering(request).set_state(uow=uow, name=name, state=PeerState(body.state)))


@router.post("/peering/messages", responses=error_responses(403, 404, 409, 413, 422, 429))
async def peer_message(request: Request) -> Response:
    """A peer's signed and sealed message; the answer is sealed to it. Anonymous at the HTTP level:
    the message itself says who sent it, and only a registered peer's is acted on."""
    peering = _peering(request)
    parts = runtime(request)
    source = request.client.host if request.client else "unknown"
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > _MAX_MESSAGE):
        raise InvalidInput(f"a peer's message is at most {_MAX_MESSAGE} bytes")
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > _MAX_MESSAGE:
            raise InvalidInput(f"a peer's message is at most {_MAX_MESSAGE} bytes")

    def act() -> bytes:
        # In the worker thread: on PostgreSQL the limit asks the database.
        parts.agent_limiter.take(f"peer:{source}", who="this address")
        return peering.receive(data)
    answer = await in_worker_thread(act)
    return Response(answer, media_type="application/json")
