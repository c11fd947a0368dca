"""The post-quantum level: a minimum above 0 needs a mechanism both ends can do; none is paid for unasked."""

from __future__ import annotations

import pytest

from app.adapters.files import load_rating_table
from app.domain.algorithms import CATALOGUE, Kind, Protocol
from app.domain.errors import InvalidInput, NoFeasibleSuite
from app.domain.negotiation import Backend, NegotiationRequest, Peer, negotiate
from app.domain.negotiation.why_not import explain
from app.domain.policies import Levels, Policy
from app.domain.proposals import InvalidProposal, parse
from app.domain.tunnels import (
    ExpectedSa,
    Gateway,
    ObservedSa,
    TunnelEnd,
    conn_payload,
    expected_sa,
    gateway_capabilities,
    has_ppk,
    keywords_from_charon,
    mismatches,
)
from app.settings import SHIPPED_RATINGS_DIR

STD = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
ESAF = load_rating_table(SHIPPED_RATINGS_DIR / "esaf-2006.yaml")
LIBIPSEC = Backend(name="kernel-libipsec", ah=False, ah_esp_bundle=False, transport=False)
#: What Debian's charon 5.9.8 offers: every classical algorithm and a PPK, no ML-KEM.
CHARON_598 = frozenset(k for k, a in CATALOGUE.items() if a.kind is not Kind.POST_QUANTUM) | {"ppk"}
CLASSICAL = frozenset(k for k, a in CATALOGUE.items() if a.kind is not Kind.POST_QUANTUM)
#: A strongSwan 6 charon: ML-KEM as well.
CHARON_6 = CHARON_598 | {"mlkem512", "mlkem768", "mlkem1024"}


def run(levels: dict[str, int], *ends: frozenset[str], table=STD):  # type: ignore[no-untyped-def]
    peers = [Peer(f"gw-{i}", Policy(), table, supports=s) for i, s in enumerate(ends)]
    peers.append(Peer("request", Policy.from_dict({"min_levels": levels}), table))
    return negotiate(NegotiationRequest(peers=peers, table=table, default_table=STD, backend=LIBIPSEC))


def test_without_a_post_quantum_minimum_nothing_is_chosen_or_paid_for() -> None:
    plain = run({"confidentiality": 8, "integrity": 8}, CHARON_598, CHARON_598)
    assert plain.suite.post_quantum is None
    assert plain.levels.post_quantum == 0
    assert plain.as_dict()["levels"]["post_quantum"] == 0
    assert "ke1_" not in (plain.proposals["ike"] or "")
    assert run({"confidentiality": 8, "integrity": 8}, CHARON_6, CHARON_6).suite.post_quantum is None


def test_two_charons_5_9_8_get_a_ppk_for_a_post_quantum_minimum() -> None:
    result = run({"confidentiality": 8, "integrity": 8, "post_quantum": 5}, CHARON_598, CHARON_598)
    assert result.suite.post_quantum == "ppk"
    assert result.levels.post_quantum == 9
    assert result.as_dict()["suite"]["post_quantum"] == "ppk"
    plain = run({"confidentiality": 8, "integrity": 8}, CHARON_598, CHARON_598)
    assert result.proposals == plain.proposals  # a PPK is no proposal keyword
    assert result.requirement["request"]["post_quantum"] == 5


def test_a_minimum_above_what_a_ppk_reaches_is_refused_naming_the_best() -> None:
    with pytest.raises(NoFeasibleSuite) as info:
        run({"post_quantum": 10}, CHARON_598, CHARON_598)
    assert [(u.peer, u.requirement, u.level, u.best_available) for u in info.value.unmet] == [
        ("request", "post_quantum", 10, 9)]
    assert any("post-quantum" in n for n in info.value.notes)


def test_an_end_without_any_mechanism_refuses_and_says_which() -> None:
    with pytest.raises(NoFeasibleSuite) as info:
        run({"post_quantum": 1}, CHARON_598, CLASSICAL)
    assert [(u.requirement, u.level, u.best_available) for u in info.value.unmet] == [("post_quantum", 1, None)]
    assert any("not supported by gw-1" in n for n in info.value.notes)


def test_strongswan_6_ends_take_the_cheaper_ml_kem_into_the_ike_proposal() -> None:
    result = run({"confidentiality": 8, "integrity": 8, "post_quantum": 9}, CHARON_6, CHARON_6)
    assert result.suite.post_quantum == "mlkem768"  # cheaper than a PPK in the shipped table, same level
    assert result.proposals["ike"] is not None
    assert result.proposals["ike"].endswith("-ke1_mlkem768")
    assert result.ike["additional_key_exchange"] == "mlkem768"
    parsed = parse(result.proposals["ike"], Protocol.IKE)
    assert parsed.additional_key_exchange == "mlkem768"
    assert run({"post_quantum": 10}, CHARON_6, CHARON_6).suite.post_quantum == "mlkem1024"


def test_one_strongswan_6_end_and_one_5_9_end_meet_on_the_ppk() -> None:
    assert run({"post_quantum": 8}, CHARON_6, CHARON_598).suite.post_quantum == "ppk"


def test_a_table_without_post_quantum_rows_borrows_the_default_and_says_so() -> None:
    result = run({"confidentiality": 8, "integrity": 4, "post_quantum": 9}, CHARON_598, CHARON_598, table=ESAF)
    assert result.suite.post_quantum == "ppk"
    assert any("post_quantum" in n and "standards-2026" in n for n in result.notes)


def test_a_forbidden_ppk_is_not_used() -> None:
    peers = [Peer("gw", Policy(), STD, supports=CHARON_598),
             Peer("request", Policy.from_dict({"min_levels": {"post_quantum": 3}, "deny": ["ppk"]}), STD)]
    with pytest.raises(NoFeasibleSuite):
        negotiate(NegotiationRequest(peers=peers, table=STD, default_table=STD, backend=LIBIPSEC))


@pytest.mark.parametrize("proposal", ["aes128-sha256-x25519-ppk", "aes128-sha256-mlkem768",
                                      "aes128-sha256-x25519-ke1_x448"])
def test_proposals_take_ml_kem_only_as_an_additional_exchange(proposal: str) -> None:
    with pytest.raises(InvalidProposal):
        parse(proposal, Protocol.IKE)


def test_ml_kem_is_no_esp_additional_exchange() -> None:
    with pytest.raises(InvalidProposal):
        parse("aes128gcm16-ke1_mlkem768", Protocol.ESP)


@pytest.mark.parametrize(("version", "ppk"), [("5.9.8", True), ("charon 5.9.8", True), ("5.7.0", True),
                                              ("6.0.1", True), ("5.6.3", False), ("", False), (None, False),
                                              ("unknown", False)])
def test_a_ppk_comes_with_strongswan_5_7(version: str | None, ppk: bool) -> None:
    assert has_ppk(version) is ppk
    assert ("ppk" in keywords_from_charon({"ke": {"CURVE_25519": "openssl"}}, version=version)) is ppk


def test_ml_kem_is_read_from_get_algorithms_ke_section() -> None:
    found = keywords_from_charon({"ke": {"CURVE_25519": "openssl", "ML_KEM_768": "ml", "ML_KEM_1024": "ml"}},
                                 version="6.0.1")
    assert {"x25519", "ppk", "mlkem768", "mlkem1024"} <= found
    assert "mlkem512" not in found
    assert not {"mlkem512", "mlkem768", "mlkem1024"} & keywords_from_charon({"ke": {"CURVE_25519": "x"}})


def test_a_gateway_recorded_before_ppks_were_known_has_one_by_its_version() -> None:
    gw = Gateway(name="g", vici_socket="/x", ike_address="10.0.0.1", identity="g.qoss",
                 inside_networks=("10.1.0.0/24",), version="charon 5.9.8", algorithms=frozenset({"x25519"}))
    assert gateway_capabilities(gw) == {"x25519", "ppk"}


def test_a_conn_with_a_ppk_requires_it() -> None:
    ends = (TunnelEnd("10.0.0.1", "a", ("10.1.0.0/24",)), TunnelEnd("10.0.0.2", "b", ("10.2.0.0/24",)))
    common = {"name": "qoss-t", "local": ends[0], "remote": ends[1], "ike_proposal": "aes128-sha256-x25519",
              "esp_proposal": "aes128-sha256", "ah_proposal": None, "mode": "tunnel", "ike_lifetime": 3600,
              "child_lifetime": 3600}
    with_ppk = conn_payload(**common, ppk_id="qoss-ppk-1")  # type: ignore[arg-type]
    assert (with_ppk["ppk_id"], with_ppk["ppk_required"]) == ("qoss-ppk-1", "yes")
    assert "ppk_id" not in conn_payload(**common)  # type: ignore[arg-type]


def _observed(expected: ExpectedSa, ppk: bool) -> ObservedSa:
    return ObservedSa("ESTABLISHED", expected.ike_encr, expected.ike_encr_keysize, expected.ike_integ,
                      expected.ike_prf, expected.ike_dh, "INSTALLED", expected.child_protocol, expected.child_encr,
                      expected.child_encr_keysize, expected.child_integ, ike_ppk=ppk)


@pytest.mark.parametrize(("chosen", "negotiated", "wrong"), [("ppk", True, False), ("ppk", False, True),
                                                              (None, True, True), (None, False, False)])
def test_verification_wants_a_ppk_exactly_where_one_was_chosen(chosen: str | None, negotiated: bool,
                                                                wrong: bool) -> None:
    ike = {"encryption": "aes256gcm16", "integrity": None, "prf": "prfsha384", "key_exchange": "x25519"}
    expected = expected_sa(ike=ike, protocol="esp", encryption="aes256gcm16", integrity=None, post_quantum=chosen)
    found = mismatches(expected, _observed(expected, negotiated))
    assert bool(found) is wrong
    if wrong:
        assert "post-quantum preshared key" in found[0]


def test_levels_from_an_old_document_have_no_post_quantum_minimum() -> None:
    assert Levels.from_dict({"confidentiality": 8, "integrity": 8, "key_exchange": 8}).post_quantum == 0
    assert Levels(8, 8, 8).stored() == {"confidentiality": 8, "integrity": 8, "key_exchange": 8}
    assert Levels(8, 8, 8, 5).stored()["post_quantum"] == 5


def _why(result, keyword: str):  # type: ignore[no-untyped-def]
    return explain(result, keyword, pricing=lambda kind: STD, every=lambda: result)


def test_why_not_ppk_names_the_end_that_cannot() -> None:
    result = run({"post_quantum": 8}, CHARON_6, CLASSICAL | {"mlkem768"})
    assert result.suite.post_quantum == "mlkem768"
    answer = _why(result, "ppk")
    assert (answer.verdict, answer.peer) == ("rejected", "gw-1")
    assert "not supported by gw-1" in answer.reason
    assert _why(result, "mlkem768").verdict == "chosen"


def test_why_not_a_mechanism_below_the_minimum_names_the_level() -> None:
    answer = _why(run({"post_quantum": 9}, CHARON_6, CHARON_6), "mlkem512")
    assert answer.verdict == "rejected"
    assert answer.below == {"level": "post quantum", "have": "8", "need": "9", "peer": "request"}


def test_why_not_a_costlier_mechanism_and_one_nobody_asked_for() -> None:
    answer = _why(run({"post_quantum": 9}, CHARON_6, CHARON_6), "ppk")
    assert answer.verdict == "costlier"
    assert answer.extra_cost is not None
    assert answer.extra_cost > 0
    unasked = _why(run({"confidentiality": 8}, CHARON_598, CHARON_598), "ppk")
    assert unasked.verdict == "unused"
    assert "post_quantum 0" in unasked.reason


# --------------------------------------------------------------------------- peering messages

_OFFER: dict[str, object] = {
    "tunnel_id": "abc123", "sender": "site-a", "timestamp": 1_700_000_000, "nonce": "n" * 24, "gateway": "gw-b",
    "initiator": {"address": "10.99.0.1", "identity": "abc123.gw-a.qoss", "networks": ["10.1.0.1/32"]},
    "networks": [], "min_levels": {"confidentiality": 5}, "suites": ["aes128gcm16-x25519"],
    "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]}
_ANSWER: dict[str, object] = {
    "tunnel_id": "abc123", "sender": "site-b", "timestamp": 1_700_000_000, "nonce": "a" * 24, "chosen": 0, "ike": 0,
    "responder": {"address": "10.99.0.2", "identity": "abc123.gw-b.qoss", "networks": ["10.2.0.1/32"]},
    "psk": "11" * 32, "expires": 1_700_000_010}


def test_an_offer_without_a_post_quantum_ask_reads_as_an_older_peer_wrote_it() -> None:
    from app.domain.peering import Offer

    offer = Offer.from_dict(_OFFER)
    assert offer.post_quantum == ()
    assert offer.min_levels.post_quantum == 0
    doc = offer.as_dict()
    assert "post_quantum" not in doc
    assert doc["min_levels"] == {"confidentiality": 5, "integrity": 0, "key_exchange": 0}


def test_an_offer_names_the_mechanisms_the_initiator_takes() -> None:
    from app.domain.peering import Offer

    offer = Offer.from_dict({**_OFFER, "min_levels": {"post_quantum": 5}, "post_quantum": ["ppk"]})
    assert offer.post_quantum == ("ppk",)
    assert Offer.from_dict(offer.as_dict()) == offer
    for bad in (["aes128"], ["ppk", "ppk"], "ppk", [5]):
        with pytest.raises(InvalidInput, match="post_quantum"):
            Offer.from_dict({**_OFFER, "post_quantum": bad})


def test_an_answer_carries_the_ppk_only_when_there_is_one_and_never_shows_it() -> None:
    from app.domain.peering import Answer

    plain = Answer.from_dict(_ANSWER)
    assert plain.ppk is None
    assert "ppk" not in plain.as_dict()
    key = bytes(range(32))
    carrying = Answer.from_dict({**_ANSWER, "ppk_id": "qoss-ppk-" + "ab" * 12, "ppk": key.hex()})
    assert carrying.ppk == ("qoss-ppk-" + "ab" * 12, key)
    assert Answer.from_dict(carrying.as_dict()) == carrying
    assert key.hex() not in repr(carrying)
    for bad in ({"ppk": key.hex()}, {"ppk_id": "qoss-ppk-" + "ab" * 12}, {"ppk_id": "x", "ppk": key.hex()},
                {"ppk_id": "qoss-ppk-" + "ab" * 12, "ppk": "00"}):
        with pytest.raises(InvalidInput, match="ppk"):
            Answer.from_dict({**_ANSWER, **bad})
