"""Repeated negotiations reuse their result until a table or policy they read changes."""

from __future__ import annotations

import pytest

from app.domain.errors import InvalidPolicy
from app.domain.policies import Levels
from app.domain.requests import NegotiationSpec, PeerSpec
from app.services import negotiation, policies, ratings
from app.services.negotiation import run_negotiation
from app.services.ratings import TableCache
from tests.fakes.uow import FakeUnitOfWork

TABLE = "standards-2026"


@pytest.fixture(autouse=True)
def fresh_results() -> None:
    negotiation._RESULTS.clear()


def body(**peer: object) -> NegotiationSpec:
    return NegotiationSpec(peers=(PeerSpec(name="a", **peer),))  # type: ignore[arg-type]


def negotiate(uow: FakeUnitOfWork, cache: TableCache, request: NegotiationSpec) -> negotiation.NegotiationResult:
    return run_negotiation(uow=uow, cache=cache, request=request, default_table=TABLE)


def test_the_same_request_is_answered_from_the_cache_with_the_engines_result(uow: FakeUnitOfWork) -> None:
    cache = TableCache(ttl=3600)
    request = body(min_levels=Levels(confidentiality=8, integrity=8))
    first = negotiate(uow, cache, request)
    again = negotiate(uow, cache, body(min_levels=Levels(confidentiality=8, integrity=8)))
    assert again is first
    negotiation._RESULTS.clear()
    assert negotiate(uow, cache, request).as_dict() == first.as_dict()
    other = negotiate(uow, cache, body(min_levels=Levels(confidentiality=10, integrity=10)))
    assert other is not first
    assert other.levels.confidentiality >= 10


def test_a_new_table_revision_is_negotiated_afresh(uow: FakeUnitOfWork) -> None:
    cache = TableCache(ttl=0)  # every negotiation reads the table's revision
    request = body(min_levels=Levels(confidentiality=8, integrity=8))
    first = negotiate(uow, cache, request)
    chosen = first.suite.encryption
    assert chosen is not None
    table = ratings.get_table(uow=uow, name=TABLE)
    ratings.update_rating(uow=uow, name=TABLE, algorithm=chosen, changes={"performance": 0.1},
                          expected_revision=table.revision, author="test")
    changed = negotiate(uow, cache, request)
    assert changed is not first
    assert changed.suite.encryption != chosen


def test_a_changed_policy_is_negotiated_afresh(uow: FakeUnitOfWork) -> None:
    cache = TableCache(ttl=3600)
    document = {"name": "office", "min_levels": {"confidentiality": 3, "integrity": 3}}
    _, revision = policies.create_policy(uow=uow, document=document, author="test")
    first = negotiate(uow, cache, body(policy="office"))
    assert negotiate(uow, cache, body(policy="office")) is first
    policies.replace_policy(uow=uow, name="office", expected_revision=revision, author="test",
                            document={**document, "min_levels": {"confidentiality": 10, "integrity": 10}})
    stricter = negotiate(uow, cache, body(policy="office"))
    assert stricter is not first
    assert stricter.levels.confidentiality >= 10 > first.levels.confidentiality


def test_the_cache_keeps_only_the_most_recent_results() -> None:
    results = negotiation._Results(2)
    fake = object()
    for i in range(3):
        results.put((i,), fake, ())  # type: ignore[arg-type]
    assert results.get((0,)) is None
    assert results.get((1,)) is fake
    assert results.get((2,)) is fake


def test_unknown_keywords_are_refused_every_time_and_never_cached(uow: FakeUnitOfWork) -> None:
    """Keywords are checked only when a result is made: a refused request leaves nothing to hit."""
    cache = TableCache(ttl=3600)
    for _ in range(2):
        with pytest.raises(InvalidPolicy, match="nosuchcipher"):
            negotiate(uow, cache, body(supports=("aes128gcm16", "nosuchcipher", "x25519", "prfsha256")))
    good = negotiate(uow, cache, body(supports=("aes128gcm16", "x25519", "prfsha256")))
    assert negotiate(uow, cache, body(supports=("aes128gcm16", "x25519", "prfsha256"))) is good
    with pytest.raises(InvalidPolicy, match="nosuchcipher"):
        negotiate(uow, cache, body(supports=("aes128gcm16", "x25519", "prfsha256"), forbids=("nosuchcipher",)))
