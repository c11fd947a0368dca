"""The request values the services take: a secret that never shows itself, and the invariants
the services rely on."""

from __future__ import annotations

import pytest

from app.domain.errors import InvalidInput
from app.domain.requests import NegotiationSpec, Secret, TunnelPeerSpec, TunnelSpec

PSK = "a-peer-psk-that-must-never-be-printed-0123"


def test_a_secret_never_shows_itself() -> None:
    secret = Secret(PSK)
    peer = TunnelPeerSpec(address="192.0.2.7", psk=secret)
    tunnel = TunnelSpec(initiator="left", peer=peer, remote_ts=("10.2.0.0/24",))
    for text in (repr(secret), str(secret), f"{secret}", repr(peer), repr(tunnel), str(tunnel)):
        assert PSK not in text
    assert secret.get_secret_value() == PSK


def test_secrets_are_equal_by_value() -> None:
    assert Secret(PSK) == Secret(PSK)
    assert Secret(PSK) != Secret(PSK + "x")
    assert hash(Secret(PSK)) == hash(Secret(PSK))


def test_a_tunnel_needs_exactly_one_far_end() -> None:
    peer = TunnelPeerSpec(address="192.0.2.7", psk=Secret(PSK))
    with pytest.raises(InvalidInput, match="exactly one of responder"):
        TunnelSpec(initiator="left")
    with pytest.raises(InvalidInput, match="exactly one of responder"):
        TunnelSpec(initiator="left", responder="right", peer=peer, remote_ts=("10.2.0.0/24",))


def test_a_tunnel_to_a_peer_needs_remote_ts() -> None:
    with pytest.raises(InvalidInput, match="needs remote_ts"):
        TunnelSpec(initiator="left", peer=TunnelPeerSpec(address="192.0.2.7", psk=Secret(PSK)))


def test_a_negotiation_needs_a_peer() -> None:
    with pytest.raises(InvalidInput, match="at least one peer"):
        NegotiationSpec(peers=())
