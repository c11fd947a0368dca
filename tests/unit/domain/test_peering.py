"""The peers' exchange, pure: the choice over both sides' orders and the messages' checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.errors import InvalidInput
from app.domain.peering import MAX_SUITES, Answer, Move, MoveAnswer, Offer, Peer, choose, parse_peered
from app.domain.policies import Levels

_SUITES = st.lists(st.sampled_from([f"s{i}" for i in range(12)]), unique=True, max_size=12)


@given(_SUITES, _SUITES)
def test_the_choice_is_in_both_orders_with_the_least_combined_rank_ties_to_the_responders(
        ours: list[str], theirs: list[str]) -> None:
    chosen = choose(ours, theirs)
    common = [s for s in ours if s in theirs]
    if not common:
        assert chosen is None
        return
    assert chosen is not None
    suite = ours[chosen]
    assert suite in theirs
    best = min(ours.index(s) + theirs.index(s) for s in common)
    assert ours.index(suite) + theirs.index(suite) == best
    tied = [s for s in common if ours.index(s) + theirs.index(s) == best]
    assert theirs.index(suite) == min(theirs.index(s) for s in tied)


def test_the_responders_order_breaks_a_tie() -> None:
    assert choose(["a", "b"], ["b", "a"]) == 1  # a: 0 + 1, b: 1 + 0; the responder's cheaper wins the tie
    assert choose(["a", "b", "c"], ["c", "x", "a"]) == 2  # a: 0 + 2, c: 2 + 0: c, the responder's first
    assert choose(["a", "b", "c"], ["x", "a", "c"]) == 0  # a: 0 + 1 is the least
    assert choose(["a"], ["b"]) is None


def test_gateway_at_peer_is_parsed_and_a_plain_name_is_local() -> None:
    assert parse_peered("gw-b@site-b") == ("gw-b", "site-b")
    assert parse_peered("right") is None
    for bad in ("@site", "gw@", "gw@Site B", "gw@@x"):
        with pytest.raises(InvalidInput):
            parse_peered(bad)


def _offer(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "tunnel_id": "abc123", "sender": "site-a", "timestamp": 1_700_000_000, "nonce": "n" * 24, "gateway": "gw-b",
        "initiator": {"address": "10.99.0.1", "identity": "abc123.gw-a.qoss", "networks": ["10.1.0.1/32"]},
        "networks": [], "min_levels": {"confidentiality": 5}, "suites": ["aes128gcm16-x25519"],
        "ikes": ["aes128gcm16-prfsha256-x25519"], "mode": "tunnel", "lifetimes": [3600, 1200]}
    doc.update(changes)
    return doc


def test_an_offer_round_trips() -> None:
    offer = Offer.from_dict(_offer())
    assert Offer.from_dict(offer.as_dict()) == offer
    assert offer.min_levels == Levels(5, 0, 0)


@pytest.mark.parametrize(("change", "says"), [
    ({"extra": 1}, "unknown fields"),
    ({"suites": []}, "offer.suites"),
    ({"suites": [f"aes{i}" for i in range(MAX_SUITES + 1)]}, "offer.suites"),
    ({"suites": ["aes128", "aes128"]}, "twice"),
    ({"suites": ["aes128; rm -rf"]}, "proposal string"),
    ({"ikes": []}, "offer.ikes"),
    ({"tunnel_id": "../../etc"}, "tunnel id"),
    ({"timestamp": True}, "timestamp"),
    ({"nonce": "short"}, "nonce"),
    ({"initiator": {"address": "not-an-ip", "identity": "x", "networks": ["10.0.0.0/8"]}}, "address"),
    ({"initiator": {"address": "10.0.0.1", "identity": "x y", "networks": ["10.0.0.0/8"]}}, "identity"),
    ({"networks": ["10.0.0.0/8"] * 17}, "networks"),
    ({"networks": ["nope"]}, "not a network"),
    ({"mode": "bridge"}, "mode"),
    ({"lifetimes": [1, 2]}, "lifetimes"),
    ({"min_levels": {"confidentiality": 11}}, "level"),
])
def test_a_malformed_offer_is_refused_saying_what(change: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        Offer.from_dict(_offer(**change))


def test_an_answer_carries_its_key_only_as_32_bytes() -> None:
    doc = {"tunnel_id": "abc123", "sender": "site-b", "timestamp": 1, "nonce": "m" * 20, "chosen": 0, "ike": 0,
           "responder": {"address": "10.99.0.2", "identity": "abc123.gw-b.qoss", "networks": ["10.2.0.1/32"]},
           "psk": "ab" * 32, "expires": 11}
    answer = Answer.from_dict(doc)
    assert answer.psk == bytes.fromhex("ab" * 32)
    assert Answer.from_dict(answer.as_dict()) == answer
    for bad in ({"psk": "ab" * 16}, {"chosen": MAX_SUITES}, {"ike": -1}, {"chosen": True}):
        with pytest.raises(InvalidInput):
            Answer.from_dict({**doc, **bad})


def test_a_peer_may_ask_only_for_its_gateways_and_networks_inside_its_own() -> None:
    peer = Peer(name="site-a", url="http://x", sign_key=b"s" * 32, kem_key=b"k" * 32, gateways=("gw-b",),
                networks=("10.2.0.0/24", "fd02::/64"), min_levels=Levels())
    assert peer.allows("gw-b", ["10.2.0.1/32", "10.2.0.0/25", "fd02::1/128"]) is None
    assert "gateway" in (peer.allows("gw-c", ["10.2.0.1/32"]) or "")
    assert "network" in (peer.allows("gw-b", ["10.2.0.0/23"]) or "")
    assert "network" in (peer.allows("gw-b", ["10.3.0.1/32"]) or "")


def _move(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {"tunnel_id": "abc123", "sender": "site-b", "timestamp": 1_700_000_000, "nonce": "n" * 24,
                              "suites": ["aes256gcm16-x25519", "chacha20poly1305-x25519"],
                              "ikes": ["aes256gcm16-prfsha256-x25519"]}
    doc.update(changes)
    return doc


def test_a_move_and_its_answer_round_trip() -> None:
    move = Move.from_dict(_move())
    assert Move.from_dict(move.as_dict()) == move
    assert move.suites == ("aes256gcm16-x25519", "chacha20poly1305-x25519")
    answer = MoveAnswer(tunnel_id="abc123", sender="site-a", timestamp=1_700_000_000, nonce="m" * 24, chosen=1, ike=0,
                        expires=1_700_000_010)
    assert MoveAnswer.from_dict(answer.as_dict()) == answer


def test_a_move_carries_ranks_only_never_a_level_or_a_cost() -> None:
    assert set(Move.from_dict(_move()).as_dict()) == {"tunnel_id", "sender", "timestamp", "nonce", "suites", "ikes"}
    for extra in ({"levels": {"confidentiality": 8}}, {"cost": 0.5}, {"gateway": "gw-b"}):
        with pytest.raises(InvalidInput, match="unknown fields"):
            Move.from_dict(_move(**extra))


@pytest.mark.parametrize(("change", "says"), [
    ({"suites": []}, "move.suites: 1 to 16"),
    ({"suites": [f"aes128-sha{i}" for i in range(MAX_SUITES + 1)]}, "move.suites: 1 to 16"),
    ({"suites": ["aes128-sha256", "aes128-sha256"]}, "offered twice"),
    ({"ikes": ["aes128-sha256; drop"]}, "move.ikes: each is a proposal string"),
    ({"ikes": [f"aes128-sha256-modp{i}" for i in range(5)]}, "move.ikes: 1 to 4"),
    ({"tunnel_id": "../etc"}, "move.tunnel_id is not a tunnel id"),
    ({"nonce": "short"}, "move.nonce"),
    ({"timestamp": True}, "move.timestamp"),
])
def test_a_malformed_move_is_refused_saying_what(change: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=says.replace(".", r"\.")):
        Move.from_dict(_move(**change))


@pytest.mark.parametrize(("change", "says"), [
    ({"chosen": MAX_SUITES}, "move answer.chosen"), ({"chosen": True}, "move answer.chosen"),
    ({"ike": -1}, "move answer.ike"), ({"expires": "soon"}, "move answer.expires"),
    ({"psk": "00" * 32}, "unknown fields"),
])
def test_a_malformed_move_answer_is_refused_saying_what(change: dict[str, object], says: str) -> None:
    doc: dict[str, object] = {"tunnel_id": "abc123", "sender": "site-a", "timestamp": 1_700_000_000,
                              "nonce": "m" * 24, "chosen": 0, "ike": 0, "expires": 1_700_000_010, **change}
    with pytest.raises(InvalidInput, match=says):
        MoveAnswer.from_dict(doc)


def test_a_move_asking_for_a_ppk_and_its_answer_with_one_round_trip() -> None:
    move = Move.from_dict(_move(post_quantum=["ppk"]))
    assert move.post_quantum == ("ppk",)
    assert Move.from_dict(move.as_dict()) == move
    assert "post_quantum" not in Move.from_dict(_move()).as_dict()  # none asked: as before
    answer = MoveAnswer(tunnel_id="abc123", sender="site-a", timestamp=1_700_000_000, nonce="m" * 24, chosen=0, ike=0,
                        expires=1_700_000_010, ppk=("qoss-ppk-" + "ab" * 12, b"\x07" * 32))
    doc = answer.as_dict()
    assert doc["ppk_id"] == "qoss-ppk-" + "ab" * 12
    assert doc["ppk"] == "07" * 32
    assert MoveAnswer.from_dict(doc) == answer
    assert "\\x07" not in repr(answer)  # never in a log line


@pytest.mark.parametrize(("change", "says"), [
    ({"post_quantum": ["aes128"]}, "move.post_quantum: 'aes128' is not a post-quantum mechanism"),
    ({"post_quantum": "ppk"}, "move.post_quantum is a list"),
    ({"post_quantum": ["ppk", "ppk"]}, "move.post_quantum is a list"),
])
def test_a_moves_post_quantum_is_a_list_of_mechanisms(change: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=says.replace(".", r"\.")):
        Move.from_dict(_move(**change))


@pytest.mark.parametrize(("change", "says"), [
    ({"ppk_id": "qoss-ppk-" + "ab" * 12}, "answer.ppk is 32 bytes"),
    ({"ppk_id": "mine", "ppk": "00" * 32}, "answer.ppk_id is a PPK id qoss makes"),
    ({"ppk_id": "qoss-ppk-" + "ab" * 12, "ppk": "00" * 16}, "answer.ppk is 32 bytes"),
])
def test_a_move_answers_ppk_is_an_id_and_32_bytes(change: dict[str, object], says: str) -> None:
    doc: dict[str, object] = {"tunnel_id": "abc123", "sender": "site-a", "timestamp": 1_700_000_000,
                              "nonce": "m" * 24, "chosen": 0, "ike": 0, "expires": 1_700_000_010, **change}
    with pytest.raises(InvalidInput, match=says):
        MoveAnswer.from_dict(doc)
