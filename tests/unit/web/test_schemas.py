"""Each request document becomes the domain value the services take (``to_domain``): every
field carried over, lists as tuples, the PSK as a :class:`~app.domain.requests.Secret`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.domain.negotiation import Backend
from app.domain.policies import Levels, TrafficProfile
from app.domain.requests import NegotiationSpec, PeerSpec, Secret, TunnelPeerSpec, TunnelSpec
from app.web.schemas import BackendIn, MinLevelsIn, NegotiationIn, PeerIn, TrafficIn, TunnelIn, TunnelPeerIn

PSK = "correct-horse-battery-staple-0123456789"

PEER = {"name": "branch", "policy": "office", "min_levels": {"confidentiality": 8, "integrity": 6, "key_exchange": 5},
        "objectives": ["O.Comm_Trusted_Channel"], "objective_id": 3, "supports": ["aes256gcm16", "x25519"],
        "forbids": ["3des"], "rating_table": "standards-2026", "strict": True, "pfs": False, "mode": "transport"}

PEER_SPEC = PeerSpec(name="branch", policy="office", min_levels=Levels(8, 6, 5),
                     objectives=("O.Comm_Trusted_Channel",), objective_id=3, supports=("aes256gcm16", "x25519"),
                     forbids=("3des",), rating_table="standards-2026", strict=True, pfs=False, mode="transport")


def test_min_levels_become_levels() -> None:
    doc = {"confidentiality": 8, "integrity": 6, "key_exchange": 5}
    assert MinLevelsIn.model_validate(doc).to_domain() == Levels(8, 6, 5)
    assert MinLevelsIn.model_validate({"integrity": 4}).to_domain() == Levels(integrity=4)


def test_traffic_becomes_a_traffic_profile_with_a_float_throughput() -> None:
    traffic = TrafficIn.model_validate({"packet_size": 512, "min_throughput_mbps": 100}).to_domain()
    assert traffic == TrafficProfile(512, 100.0)
    assert isinstance(traffic.min_throughput_mbps, float)


def test_backend_becomes_the_engines_backend() -> None:
    doc = {"name": "kernel-libipsec", "ah": False, "ah_esp_bundle": False, "transport": False}
    assert BackendIn.model_validate(doc).to_domain() == Backend(name="kernel-libipsec", ah=False, transport=False)
    assert BackendIn.model_validate({}).to_domain() == Backend()


def test_a_full_peer_becomes_a_peer_spec() -> None:
    assert PeerIn.model_validate(PEER).to_domain() == PEER_SPEC
    assert PeerIn.model_validate({"name": "a"}).to_domain() == PeerSpec(name="a")


def test_a_full_negotiation_becomes_a_negotiation_spec() -> None:
    doc = {"rating_table": "standards-2026", "peers": [PEER, {"name": "gw", "supports": ["aes128gcm16"]}],
           "traffic": {"packet_size": 1400, "min_throughput_mbps": 2.5},
           "backend": {"name": "strongswan", "ah": True, "ah_esp_bundle": False, "transport": True},
           "alternatives": 3}
    assert NegotiationIn.model_validate(doc).to_domain() == NegotiationSpec(
        rating_table="standards-2026", peers=(PEER_SPEC, PeerSpec(name="gw", supports=("aes128gcm16",))),
        traffic=TrafficProfile(1400, 2.5), backend=Backend(), alternatives=3)
    assert NegotiationIn.model_validate({"peers": [{"name": "a"}]}).to_domain() == NegotiationSpec(
        peers=(PeerSpec(name="a"),))


def test_a_full_unmanaged_peer_becomes_a_tunnel_peer_spec_with_a_secret_psk() -> None:
    doc = {"address": "192.0.2.7", "identity": "peer.example", "local_identity": "gw.example", "psk": PSK,
           "supports": ["aes256gcm16"]}
    peer = TunnelPeerIn.model_validate(doc).to_domain()
    assert peer == TunnelPeerSpec(address="192.0.2.7", identity="peer.example", local_identity="gw.example",
                                  psk=Secret(PSK), supports=("aes256gcm16",))
    assert peer.psk.get_secret_value() == PSK
    assert PSK not in repr(peer)


def test_a_full_tunnel_document_becomes_a_tunnel_spec() -> None:
    doc = {"initiator": "left", "peer": {"address": "192.0.2.7", "psk": PSK}, "local_ts": ["10.1.0.0/24"],
           "remote_ts": ["10.2.0.0/24", "10.3.0.0/24"], "policy": "office",
           "min_levels": {"confidentiality": 8, "integrity": 6}, "objective_id": 3,
           "objectives": ["O.Comm_Trusted_Channel"], "forbids": ["3des"], "rating_table": "standards-2026",
           "traffic": {"packet_size": 512}, "strict": False}
    assert TunnelIn.model_validate(doc).to_domain() == TunnelSpec(
        initiator="left", peer=TunnelPeerSpec(address="192.0.2.7", psk=Secret(PSK)), local_ts=("10.1.0.0/24",),
        remote_ts=("10.2.0.0/24", "10.3.0.0/24"), policy="office", min_levels=Levels(8, 6, 0), objective_id=3,
        objectives=("O.Comm_Trusted_Channel",), forbids=("3des",), rating_table="standards-2026",
        traffic=TrafficProfile(512), strict=False)
    assert TunnelIn.model_validate({"initiator": "left", "responder": "right"}).to_domain() == TunnelSpec(
        initiator="left", responder="right")


def test_the_document_refuses_what_the_domain_value_would() -> None:
    with pytest.raises(ValidationError, match="give exactly one of responder"):
        TunnelIn.model_validate({"initiator": "left"})
