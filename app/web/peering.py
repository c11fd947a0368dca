"""A peer as the REST API and the console take it and show it: the registration document
(:class:`PeerIn`, the fields of ``POST /v1/peers`` and of the console's form), a state change
(:class:`PeerStateIn`) and a registered peer as answered (:func:`peer_out`)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from pydantic import Field, field_validator

from app.adapters.agent.crypto import PublicKeys
from app.domain.errors import InvalidInput
from app.domain.peering import Peer
from app.domain.policies import Levels
from app.web.schemas import Cidr, MinLevelsIn, Name, Strict

__all__ = ["PeerIn", "PeerStateIn", "peer_out"]


class PeerIn(Strict):
    """A peer to register: its name (as it calls itself), URL and public keys, and what it may ask of this side."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    url: Annotated[str, Field(min_length=8, max_length=255)]
    sign_public_key: Annotated[str, Field(min_length=43, max_length=43)]
    kem_public_key: Annotated[str, Field(min_length=43, max_length=43)]
    #: Its ML-KEM-768 key (from its identity): messages to it are sealed with ML-KEM-768 + X25519,
    #: and only such a peer's tunnels may carry a post-quantum preshared key.
    mlkem_public_key: Annotated[str, Field(min_length=1579, max_length=1579)] | None = None
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

    def to_peer(self) -> Peer:
        """The peer this document registers, its keys read.

        Raises:
            InvalidInput: a key is not 32 bytes in unpadded base64url, or the X25519 key is one no
                message can be sealed to (a low-order point).
        """
        keys = PublicKeys.from_text(self.sign_public_key, self.kem_public_key, self.mlkem_public_key)
        try:
            X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(keys.kem))
        except ValueError as exc:
            raise InvalidInput("kem_public_key is not an X25519 key a message can be sealed to") from exc
        levels = Levels.from_dict(self.min_levels.model_dump(exclude_none=True) if self.min_levels else None)
        return Peer(name=self.name, url=self.url, sign_key=keys.sign, kem_key=keys.kem, mlkem_key=keys.mlkem,
                    gateways=tuple(self.gateways), networks=tuple(self.networks), min_levels=levels)


class PeerStateIn(Strict):
    """A peering's new state: ``active``, ``suspended`` (no new tunnels) or ``revoked`` (its tunnels end)."""

    state: Literal["active", "suspended", "revoked"]


def peer_out(peer: Peer, unheard: dict[str, int] | None = None) -> dict[str, Any]:
    """A registered peer as ``GET /v1/peers`` answers it (its public keys as text, never anything
    private), with how many teardowns it has not heard yet of those ``unheard`` counts by peer
    (:meth:`~app.domain.ports.PeerStore.unheard_counts`; none given: 0)."""
    return {"name": peer.name, "url": peer.url, **PublicKeys(peer.sign_key, peer.kem_key, peer.mlkem_key).as_dict(),
            "gateways": list(peer.gateways), "networks": list(peer.networks),
            "min_levels": peer.min_levels.as_dict(), "state": peer.state.value,
            "created_at": peer.created_at, "updated_at": peer.updated_at,
            "unheard_teardowns": (unheard or {}).get(peer.name, 0)}
