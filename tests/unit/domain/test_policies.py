"""app.domain.policies: objectives to IPsec options (Liu et al. Table 2-2) and policy validation."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.errors import InvalidPolicy
from app.domain.policies import (
    AH_OBJECTIVES,
    ESP_OBJECTIVES,
    OBJECTIVE_THREATS,
    IpsecOption,
    Levels,
    Mode,
    Policy,
    TrafficProfile,
    ipsec_option,
    objectives_for_id,
    parse_objectives,
)

# --------------------------------------------------------------------------- Liu et al. Table 2-2


@pytest.mark.parametrize(
    ("objective_id", "option", "objectives"),
    [
        (1, IpsecOption.NATIVE, set()),
        (2, IpsecOption.AH, {"O.Integrity_Attr_Exch", "O.Non-repudiation"}),
        (3, IpsecOption.ESP, {"O.Comm_Trusted_Channel", "O.Data_Exchange_Conf", "O.Crypto_Comm_Channel"}),
        (4, IpsecOption.AH_ESP, {"O.Comm_Trusted_Channel", "O.Data_Exchange_Conf", "O.Crypto_Comm_Channel",
                                 "O.Integrity_Attr_Exch", "O.Non-repudiation"}),
    ],
)
def test_objective_id_maps_to_table_2_2_row(objective_id: int, option: IpsecOption, objectives: set[str]) -> None:
    assert objectives_for_id(objective_id) == objectives
    policy = Policy.from_dict({"objective_id": objective_id})
    assert policy.option is option
    assert policy.objectives == objectives
    assert policy.objective_id == objective_id


def test_objective_id_1_is_native_no_ipsec() -> None:
    policy = Policy.from_dict({"objective_id": 1})
    assert policy.wants_native
    assert not Policy.from_dict({"objective_id": 3}).wants_native


def test_table_2_1_threats_cover_all_five_objectives() -> None:
    assert set(OBJECTIVE_THREATS) == AH_OBJECTIVES | ESP_OBJECTIVES
    assert OBJECTIVE_THREATS["O.Data_Exchange_Conf"] == "T.Hack_Comm_Eavesdrop"
    assert {OBJECTIVE_THREATS[o] for o in AH_OBJECTIVES} == {"T.Spoofing"}


@pytest.mark.parametrize(
    ("objectives", "option"),
    [
        (set(), IpsecOption.NATIVE),
        ({"O.Non-repudiation"}, IpsecOption.AH),
        ({"O.Data_Exchange_Conf"}, IpsecOption.ESP),
        ({"O.Integrity_Attr_Exch", "O.Crypto_Comm_Channel"}, IpsecOption.AH_ESP),
    ],
)
def test_any_one_objective_selects_its_protocol(objectives: set[str], option: IpsecOption) -> None:
    assert ipsec_option(frozenset(objectives)) is option


def test_named_objectives_merge_with_objective_id() -> None:
    policy = Policy.from_dict({"objective_id": 3, "objectives": ["O.Non-repudiation"]})
    assert policy.option is IpsecOption.AH_ESP
    assert policy.objectives == ESP_OBJECTIVES | {"O.Non-repudiation"}


def test_no_objectives_is_native() -> None:
    policy = Policy.from_dict({})
    assert policy.option is IpsecOption.NATIVE
    assert policy.objective_id is None
    assert not policy.wants_native


@pytest.mark.parametrize("objective_id", [0, 5, -1, "3", 3.0, True, [3], {"id": 3}])
def test_unknown_objective_id_is_refused(objective_id: Any) -> None:
    with pytest.raises(InvalidPolicy, match=r"objective_id must be one of \[1, 2, 3, 4\]"):
        Policy.from_dict({"objective_id": objective_id})


@pytest.mark.parametrize("objectives", [["O.Everything"], ["o.data_exchange_conf"], [["O.Non-repudiation"]], [7]])
def test_unknown_objective_is_refused_listing_the_known_ones(objectives: Any) -> None:
    with pytest.raises(InvalidPolicy, match=r"unknown objective.*O\.Data_Exchange_Conf"):
        Policy.from_dict({"objectives": objectives})


@pytest.mark.parametrize("objectives", ["O.Non-repudiation", {"O.Non-repudiation": 1}, ["O.Non-repudiation"] * 17])
def test_objectives_must_be_a_short_list(objectives: Any) -> None:
    with pytest.raises(InvalidPolicy, match="objectives must be a list"):
        parse_objectives(objectives, None)


# --------------------------------------------------------------------------- levels


def test_levels_default_to_zero_and_keep_what_is_given() -> None:
    policy = Policy.from_dict({"min_levels": {"integrity": 4}})
    assert policy.min_levels == Levels(confidentiality=0, integrity=4, key_exchange=0)
    assert policy.min_levels.as_dict() == {"confidentiality": 0, "integrity": 4, "key_exchange": 0,
                                           "post_quantum": 0}


def test_policy_without_post_quantum_means_zero_and_with_it_keeps_it() -> None:
    old = Policy.from_dict({"min_levels": {"confidentiality": 8, "integrity": 8, "key_exchange": 8}})
    assert old.min_levels.post_quantum == 0
    pq = Policy.from_dict({"min_levels": {"post_quantum": 6}})
    assert pq.min_levels == Levels(post_quantum=6)
    assert Policy.from_dict(pq.as_dict()).min_levels.post_quantum == 6
    assert pq.for_peer(min_levels=Levels(post_quantum=3)).min_levels.post_quantum == 6
    assert old.for_peer(min_levels=Levels(post_quantum=3)).min_levels.post_quantum == 3


@pytest.mark.parametrize("value", [11, -1, 4.5, "4", True])
def test_bad_post_quantum_level_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidPolicy, match=r"min_levels.post_quantum: a level is an integer from 0 to 10"):
        Policy.from_dict({"min_levels": {"post_quantum": value}})


@pytest.mark.parametrize("value", [11, -1, 4.5, "4", True, None])
def test_bad_level_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidPolicy, match=r"min_levels.integrity: a level is an integer from 0 to 10"):
        Policy.from_dict({"min_levels": {"integrity": value}})


def test_unknown_level_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidPolicy, match=r"unknown levels \['secrecy'\].*confidentiality"):
        Policy.from_dict({"min_levels": {"secrecy": 3}})


def test_levels_must_be_a_mapping() -> None:
    with pytest.raises(InvalidPolicy, match="min_levels must be a mapping"):
        Policy.from_dict({"min_levels": [8, 5, 6]})


# --------------------------------------------------------------------------- allow / deny


def test_allow_and_deny_resolve_aliases_to_canonical_keywords() -> None:
    policy = Policy.from_dict({"allow": ["aes", "SHA", "curve25519", "aes128gcm128"], "deny": ["blowfish", "sha2_256"]})
    assert policy.allow == {"aes128", "sha1", "x25519", "aes128gcm16"}
    assert policy.deny == {"blowfish128", "sha256"}


def test_allow_absent_means_anything_and_empty_means_nothing() -> None:
    assert Policy.from_dict({}).allow is None
    assert Policy.from_dict({"allow": []}).allow == frozenset()
    assert Policy.from_dict({}).deny == frozenset()


def test_unknown_keyword_in_deny_is_refused_with_close_matches() -> None:
    with pytest.raises(InvalidPolicy, match=r"deny: unknown algorithm 'sha265'.*sha256"):
        Policy.from_dict({"deny": ["sha265"]})


@pytest.mark.parametrize("value", ["aes128", {"aes128": True}, [1], ["aes128"] * 201])
def test_allow_must_be_a_list_of_keywords(value: Any) -> None:
    with pytest.raises(InvalidPolicy, match="allow"):
        Policy.from_dict({"allow": value})


# --------------------------------------------------------------------------- other fields


def test_defaults() -> None:
    policy = Policy.from_dict({"name": "p"})
    assert (policy.mode, policy.pfs, policy.strict) == (Mode.TUNNEL, True, False)
    assert (policy.ike_lifetime, policy.child_lifetime) == (14400, 3600)
    assert policy.traffic is None
    assert policy.rating_table is None


def test_traffic_profile_is_validated() -> None:
    policy = Policy.from_dict({"traffic": {"packet_size": 160, "min_throughput_mbps": 2}})
    assert policy.traffic == TrafficProfile(packet_size=160, min_throughput_mbps=2.0)
    with pytest.raises(InvalidPolicy, match="packet_size"):
        Policy.from_dict({"traffic": {"packet_size": 10}})
    with pytest.raises(InvalidPolicy, match="min_throughput_mbps"):
        Policy.from_dict({"traffic": {"min_throughput_mbps": -1}})
    with pytest.raises(InvalidPolicy, match="unknown fields"):
        Policy.from_dict({"traffic": {"mtu": 1500}})


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"mode": "beet"}, "mode"),
        ({"pfs": "yes"}, "pfs"),
        ({"strict": 1}, "strict"),
        ({"ike_lifetime": 59}, "ike_lifetime"),
        ({"child_lifetime": 86400 * 7 + 1}, "child_lifetime"),
        ({"rating_table": "Not A Name"}, "name"),
        ({"description": 5}, "description"),
        ({"name": "UPPER"}, "name"),
        ({"surprise": 1}, "unknown fields"),
        ({1: "x", "surprise": 1}, "unknown fields"),
    ],
)
def test_bad_policy_field_is_refused_naming_it(doc: dict[Any, Any], fragment: str) -> None:
    with pytest.raises(InvalidPolicy, match=fragment):
        Policy.from_dict(doc)


def test_policy_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidPolicy, match="must be a mapping"):
        Policy.from_dict(["name", "p"])  # type: ignore[arg-type]


def test_policy_as_dict_round_trips() -> None:
    policy = Policy.from_dict({
        "name": "everything", "description": "d", "min_levels": {"confidentiality": 8, "integrity": 7},
        "objective_id": 4, "allow": ["aes"], "deny": ["md5"], "traffic": {"packet_size": 200},
        "mode": "transport", "pfs": False, "strict": True, "rating_table": "esaf-2006",
        "ike_lifetime": 600, "child_lifetime": 300,
    })
    assert Policy.from_dict(policy.as_dict()) == policy
