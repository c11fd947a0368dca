"""Repeated negotiations reuse their result until a table or policy they read changes."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from app.domain.errors import InvalidPolicy
from app.services import negotiation, policies, ratings
from app.services.negotiation import MinLevelsIn, NegotiationIn, PeerIn, run_negotiation
from app.services.ratings import TableCache

TABLE = "standards-2026"


@pytest.fixture(autouse=True)
def fresh_results() -> None:
    negotiation._RESULTS.clear()


def body(**peer: object) -> NegotiationIn:
    return NegotiationIn(peers=[PeerIn(name="a", **peer)])  # type: ignore[arg-type]


def negotiate(session: Session, cache: TableCache, request: NegotiationIn) -> negotiation.NegotiationResult:
    return run_negotiation(session=session, cache=cache, request=request, default_table=TABLE)


def test_the_same_request_is_answered_from_the_cache_with_the_engines_result(session: Session) -> None:
    cache = TableCache(ttl=3600)
    request = body(min_levels=MinLevelsIn(confidentiality=8, integrity=8))
    first = negotiate(session, cache, request)
    again = negotiate(session, cache, body(min_levels=MinLevelsIn(confidentiality=8, integrity=8)))
    assert again is first
    negotiation._RESULTS.clear()
    assert negotiate(session, cache, request).as_dict() == first.as_dict()
    other = negotiate(session, cache, body(min_levels=MinLevelsIn(confidentiality=10, integrity=10)))
    assert other is not first
    assert other.levels.confidentiality >= 10


def test_a_new_table_revision_is_negotiated_afresh(session: Session) -> None:
    cache = TableCache(ttl=0)  # every negotiation reads the table's revision
    request = body(min_levels=MinLevelsIn(confidentiality=8, integrity=8))
    first = negotiate(session, cache, request)
    chosen = first.suite.encryption
    assert chosen is not None
    table = ratings.get_table(session=session, name=TABLE)
    ratings.update_rating(session=session, name=TABLE, algorithm=chosen, changes={"performance": 0.1},
                          expected_revision=table.revision, author="test")
    changed = negotiate(session, cache, request)
    assert changed is not first
    assert changed.suite.encryption != chosen


def test_a_changed_policy_is_negotiated_afresh(session: Session) -> None:
    cache = TableCache(ttl=3600)
    document = {"name": "office", "min_levels": {"confidentiality": 3, "integrity": 3}}
    _, revision = policies.create_policy(session=session, document=document, author="test")
    first = negotiate(session, cache, body(policy="office"))
    assert negotiate(session, cache, body(policy="office")) is first
    policies.replace_policy(session=session, name="office", expected_revision=revision, author="test",
                            document={**document, "min_levels": {"confidentiality": 10, "integrity": 10}})
    stricter = negotiate(session, cache, body(policy="office"))
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


def test_unknown_keywords_are_refused_every_time_and_never_cached(session: Session) -> None:
    """Keywords are checked only when a result is made: a refused request leaves nothing to hit."""
    cache = TableCache(ttl=3600)
    for _ in range(2):
        with pytest.raises(InvalidPolicy, match="nosuchcipher"):
            negotiate(session, cache, body(supports=["aes128gcm16", "nosuchcipher", "x25519", "prfsha256"]))
    good = negotiate(session, cache, body(supports=["aes128gcm16", "x25519", "prfsha256"]))
    assert negotiate(session, cache, body(supports=["aes128gcm16", "x25519", "prfsha256"])) is good
    with pytest.raises(InvalidPolicy, match="nosuchcipher"):
        negotiate(session, cache, body(supports=["aes128gcm16", "x25519", "prfsha256"], forbids=["nosuchcipher"]))
