"""Worked examples of the engine: Niedermayer et al. §7.4, Liu et al. Table 2-2, back-end fallbacks, measured costs."""

from __future__ import annotations

import pytest

from app.adapters.files import load_rating_table
from app.domain.errors import NoFeasibleSuite, UnsupportedProtection
from app.domain.negotiation import Backend, NegotiationRequest, Peer, negotiate
from app.domain.policies import Policy
from app.domain.ratings import Measurement, Rating, RatingTable
from app.settings import SHIPPED_RATINGS_DIR

ESAF = load_rating_table(SHIPPED_RATINGS_DIR / "esaf-2006.yaml")
STD = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
FULL = Backend(name="kernel-netlink", ah=True, ah_esp_bundle=True, transport=True)
LIBIPSEC = Backend(name="kernel-libipsec", ah=False, ah_esp_bundle=False, transport=False)


def one(policy: dict[str, object], table: RatingTable = ESAF, backend: Backend = FULL):  # type: ignore[no-untyped-def]
    peer = Peer("app", Policy.from_dict(policy), table)
    return negotiate(NegotiationRequest(peers=[peer], table=table, default_table=STD, backend=backend))


def test_min_integrity_4_picks_sha1() -> None:
    assert one({"min_levels": {"integrity": 4}}).suite.integrity == "sha1"


def test_min_confidentiality_8_integrity_4_picks_aes128_sha1() -> None:
    result = one({"min_levels": {"confidentiality": 8, "integrity": 4}})
    assert (result.suite.encryption, result.suite.integrity) == ("aes128", "sha1")


def test_min_integrity_9_is_infeasible_naming_best_8() -> None:
    with pytest.raises(NoFeasibleSuite) as info:
        one({"min_levels": {"integrity": 9}})
    assert [(u.peer, u.requirement, u.level, u.best_available) for u in info.value.unmet] == [
        ("app", "integrity", 9, 8)
    ]


@pytest.mark.parametrize(
    ("objective_id", "protocol", "esp", "ah"),
    [(2, "ah", False, True), (3, "esp", True, False), (4, "ah+esp", True, True)],
)
def test_objective_ids_give_seed_001_table_2_2(objective_id: int, protocol: str, esp: bool, ah: bool) -> None:
    result = one({"objective_id": objective_id}, table=STD)
    assert result.suite.protocol == protocol
    assert (result.proposals["esp"] is not None) == esp
    assert (result.proposals["ah"] is not None) == ah


def test_objective_id_1_is_native_no_ipsec() -> None:
    result = one({"objective_id": 1}, table=STD)
    assert result.suite.protocol == "none"
    assert result.proposals == {"esp": None, "ah": None, "ike": None}


def test_ah_on_libipsec_falls_back_to_esp_null_and_says_so() -> None:
    result = one({"objective_id": 2, "min_levels": {"integrity": 5}}, table=STD, backend=LIBIPSEC)
    assert result.suite.protocol == "esp"
    assert result.levels.confidentiality == 0
    assert any("AH unavailable" in n for n in result.notes)


def test_ah_esp_on_libipsec_falls_back_to_esp_with_integrity() -> None:
    result = one({"objective_id": 4}, table=STD, backend=LIBIPSEC)
    assert result.suite.protocol == "esp"
    assert result.levels.confidentiality >= 1
    assert result.levels.integrity >= 1
    assert any("AH+ESP" in n for n in result.notes)


def test_strict_policy_refuses_the_fallback() -> None:
    with pytest.raises(UnsupportedProtection):
        one({"objective_id": 2, "strict": True}, table=STD, backend=LIBIPSEC)


def test_transport_mode_falls_back_to_tunnel_on_libipsec() -> None:
    result = one({"mode": "transport", "min_levels": {"integrity": 5}}, table=STD, backend=LIBIPSEC)
    assert result.mode == "tunnel"
    assert any("transport mode unavailable" in n for n in result.notes)


def test_aead_suite_has_no_integrity_and_ike_carries_a_prf() -> None:
    table = RatingTable.of("aead-only", [
        Rating("aes128gcm16", confidentiality=8, integrity=8, performance=9),
        Rating("prfsha256", key_exchange=8, performance=8),
        Rating("x25519", key_exchange=8, performance=9),
    ])
    result = one({"min_levels": {"confidentiality": 8}}, table=table)
    assert result.suite.integrity is None
    assert result.suite.aead is True
    assert result.proposals["ike"] == "aes128gcm16-prfsha256-x25519"


def _measured(a: float, b: float) -> Measurement:
    return Measurement(a_ns_per_byte=a, b_ns=b, throughput_mbps=8000 / a)


def test_measured_costs_pick_differently_at_64_and_1400_bytes() -> None:
    # "slowbig" has a high per-byte cost but a tiny constant; "fastbig" the opposite.
    table = RatingTable.of("measured", [
        Rating("aes128gcm16", confidentiality=8, integrity=8, performance=9, measurement=_measured(0.5, 800)),
        Rating("chacha20poly1305", confidentiality=10, integrity=8, performance=8,
               measurement=_measured(1.5, 100)),
        Rating("prfsha256", key_exchange=8, performance=8),
        Rating("x25519", key_exchange=8, performance=9),
    ])
    small = negotiate(NegotiationRequest(
        peers=[Peer("voip", Policy.from_dict({"min_levels": {"confidentiality": 8},
                                               "traffic": {"packet_size": 64}}), table)],
        table=table, default_table=STD))
    bulk = negotiate(NegotiationRequest(
        peers=[Peer("bulk", Policy.from_dict({"min_levels": {"confidentiality": 8},
                                               "traffic": {"packet_size": 1400}}), table)],
        table=table, default_table=STD))
    assert small.suite.encryption == "chacha20poly1305"
    assert bulk.suite.encryption == "aes128gcm16"
    assert "measured" in small.cost_unit


def test_tie_goes_to_higher_levels_then_catalogue_order() -> None:
    table = RatingTable.of("ties", [
        Rating("aes128", confidentiality=8, performance=5),
        Rating("aes256", confidentiality=10, performance=5),
        Rating("camellia128", confidentiality=8, performance=5),
        Rating("sha256", integrity=8, performance=5),
        Rating("prfsha256", key_exchange=8, performance=8),
        Rating("x25519", key_exchange=8, performance=9),
    ])
    assert one({"min_levels": {"confidentiality": 8}}, table=table).suite.encryption == "aes256"
    assert one({"min_levels": {"confidentiality": 8}},
               table=table.without("aes256")).suite.encryption == "aes128"


def test_peer_judging_in_its_own_stricter_table_rejects_with_its_name() -> None:
    strict = RatingTable.of("strict", [Rating("sha1", integrity=3, performance=6),
                                       Rating("sha256", integrity=8, performance=3)])
    peers = [Peer("app", Policy.from_dict({"min_levels": {"integrity": 4}}), ESAF),
             Peer("auditor", Policy.from_dict({"min_levels": {"integrity": 4}}), strict)]
    result = negotiate(NegotiationRequest(peers=peers, table=ESAF, default_table=STD))
    assert result.suite.integrity == "sha256"
    sha1 = next(r for r in result.rejected if r.algorithm == "sha1")
    assert sha1.peer == "auditor"
