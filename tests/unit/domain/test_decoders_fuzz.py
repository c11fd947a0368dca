"""Fuzzing the parsers of untrusted input: nothing but the declared errors ever escapes."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.algorithms import CATALOGUE, Protocol
from app.domain.errors import InvalidPolicy, InvalidRatingTable
from app.domain.policies import Policy
from app.domain.proposals import InvalidProposal, parse
from app.domain.ratings import RatingTable

keywords = st.sampled_from([*sorted(CATALOGUE), "default", "aes", "sha", "AES128", "", " ", "modp"])
proposal_text = st.one_of(
    st.text(max_size=300),
    st.lists(keywords, min_size=1, max_size=6).map("-".join),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=30,
)
FUZZ = settings(max_examples=800, deadline=None)


@FUZZ
@given(proposal_text, st.sampled_from(list(Protocol)))
def test_proposal_parser_raises_only_invalid_proposal(text: str, protocol: Protocol) -> None:
    try:
        parsed = parse(text, protocol)
    except InvalidProposal:
        return
    assert parse(parsed.to_string(), protocol) == parsed


@FUZZ
@given(st.dictionaries(st.sampled_from(["name", "description", "source", "ratings", "x"]), json_values, max_size=5)
       | json_values)
def test_rating_table_decoder_raises_only_invalid_rating_table(doc: Any) -> None:
    with contextlib.suppress(InvalidRatingTable):
        RatingTable.from_dict(doc)


@FUZZ
@given(st.dictionaries(st.sampled_from(["name", "min_levels", "objectives", "objective_id", "allow", "deny",
                                        "traffic", "mode", "pfs", "strict", "ike_lifetime", "rating_table"]),
                       json_values, max_size=6)
       | json_values)
def test_policy_decoder_raises_only_invalid_policy(doc: Any) -> None:
    with contextlib.suppress(InvalidPolicy):
        Policy.from_dict(doc)
