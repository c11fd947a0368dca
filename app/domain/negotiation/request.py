"""What a negotiation is asked: the peers, the tables already resolved, the traffic and the back end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.domain.policies import Policy, TrafficProfile
from app.domain.ratings import RatingTable

__all__ = ["LIBIPSEC_NO_ESP", "Backend", "NegotiationRequest", "Peer"]

_ALTERNATIVES = 5

#: ESP transforms charon 5.9 with kernel-libipsec offers in ``get-algorithms`` but cannot
#: negotiate (the responder answers NO_PROPOSAL_CHOSEN), found by the catalogue sweep
#: against real charon (tests/integration/charon/test_catalogue_names.py keeps it true).
LIBIPSEC_NO_ESP: frozenset[str] = frozenset({"aes128gmac", "aes192gmac", "aes256gmac", "sha256_96"})


@dataclass(frozen=True, slots=True)
class Backend:
    """What the data plane can do (kernel-libipsec: no AH, no transport mode)."""

    name: str = "strongswan"
    ah: bool = True
    ah_esp_bundle: bool = False
    transport: bool = True

    @classmethod
    def of_ends(cls, backends: Sequence[str | None]) -> Backend:
        """What a tunnel between charons with these back ends can do: kernel-libipsec at either
        end rules out AH and transport mode (ESP in tunnel mode only); strongSwan has no AH+ESP
        bundles anywhere."""
        if "kernel-libipsec" in backends:
            return cls(name="kernel-libipsec", ah=False, ah_esp_bundle=False, transport=False)
        return cls(name=(backends[0] if backends else None) or "strongswan")


@dataclass(frozen=True)
class Peer:
    """One party: its policy, what it supports and the table its minimums are judged by.

    ``supports`` None means every catalogue algorithm. ``forbids`` adds to the
    policy's deny list.
    """

    name: str
    policy: Policy
    table: RatingTable
    supports: frozenset[str] | None = None
    forbids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NegotiationRequest:
    """Everything the engine needs; all tables already resolved."""

    peers: Sequence[Peer]
    table: RatingTable
    default_table: RatingTable
    traffic: TrafficProfile | None = None
    backend: Backend = field(default_factory=Backend)
    alternatives: int = _ALTERNATIVES
