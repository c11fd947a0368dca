"""The idempotency fingerprint of a tunnel request is pinned: a retry must match a key stored
by an earlier release, so what the fingerprint reads (every field, the PSK as its keyed hash)
must never change shape."""

from __future__ import annotations

from typing import Any

from app.domain.requests import TunnelSpec
from app.services import idempotency as idem
from app.web.schemas import TunnelIn

_KEY = bytes(range(32))

_FULL: dict[str, Any] = {
    "initiator": "left",
    "peer": {"address": "192.0.2.7", "identity": "peer.example", "psk": "p" * 40,
             "supports": ["aes256gcm16", "ecp256"]},
    "local_ts": ["10.1.0.0/24"], "remote_ts": ["10.2.0.0/24"], "policy": "office",
    "min_levels": {"confidentiality": 8, "integrity": 6}, "objective_id": 3,
    "objectives": ["O.Comm_Trusted_Channel"], "forbids": ["3des"], "rating_table": "standards-2026",
    "traffic": {"packet_size": 512, "min_throughput_mbps": 100}, "strict": True,
}


def _request(document: dict[str, Any]) -> TunnelSpec:
    return TunnelIn.model_validate(document).to_domain()


def test_fingerprint_of_a_peer_tunnel_is_pinned() -> None:
    assert idem.fingerprint(_request(_FULL), key=_KEY) == (
        "f27e6088473242756c9a35bd0b7cb40e8d41a51b2bb6f84ea61d37bbd996ac42")


def test_canonical_form_of_a_peer_tunnel_is_pinned() -> None:
    assert idem.canonical(_request(_FULL), key=_KEY) == (
        '{"forbids":["3des"],"initiator":"left","local_ts":["10.1.0.0/24"],'
        '"min_levels":{"confidentiality":8,"integrity":6,"key_exchange":0},"objective_id":3,'
        '"objectives":["O.Comm_Trusted_Channel"],"peer":{"address":"192.0.2.7","identity":"peer.example",'
        '"local_identity":null,"psk":{"hmac-sha256":"5d32dcfe17aa8eec93aa111eacd7e18da8a189f55295435aadefe0bc24a6df12"},'
        '"supports":["aes256gcm16","ecp256"]},"policy":"office","rating_table":"standards-2026",'
        '"remote_ts":["10.2.0.0/24"],"responder":null,"strict":true,'
        '"traffic":{"min_throughput_mbps":100.0,"packet_size":512}}')


def test_fingerprint_of_a_gateway_pair_is_pinned() -> None:
    assert idem.fingerprint(_request({"initiator": "left", "responder": "right"}), key=_KEY) == (
        "2a7c6c322e9ab4b4da6fe5a1064cfa21cceb0dce249a91cc9b8b5cadd8d0a51d")


def test_fingerprint_never_holds_the_psk() -> None:
    assert "p" * 40 not in idem.canonical(_request(_FULL), key=_KEY)
