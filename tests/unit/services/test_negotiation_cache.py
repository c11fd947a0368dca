"""Repeated negotiations reuse their result until a table or policy they read changes: the result is
kept by the process's table cache, which the session factory holds (the caller passes no cache)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.repositories.revisioned import TABLE_CACHE, TableCache
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.bootstrap import prepare_database
from app.domain.errors import InvalidPolicy
from app.domain.negotiation import NegotiationResult
from app.domain.policies import Levels
from app.domain.requests import NegotiationSpec, PeerSpec
from app.services import policies, ratings
from app.services.negotiation import run_negotiation
from app.settings import Settings

TABLE = "standards-2026"

Units = Callable[[], SqlUnitOfWork]


@pytest.fixture
def units(tmp_path: object) -> Iterator[Units]:
    url = f"sqlite:///{tmp_path}/q.db"
    prepare_database(Settings(database_url=url))
    engine = make_engine(url)
    factory = make_session_factory(engine, info={TABLE_CACHE: TableCache(ttl=3600)})
    yield lambda: SqlUnitOfWork(factory(), owned=True)
    engine.dispose()


def body(**peer: object) -> NegotiationSpec:
    return NegotiationSpec(peers=(PeerSpec(name="a", **peer),))  # type: ignore[arg-type]


def negotiate(units: Units, request: NegotiationSpec) -> NegotiationResult:
    with units() as uow:
        return run_negotiation(uow=uow, request=request, default_table=TABLE)


def test_the_same_request_is_answered_from_the_cache_with_the_engines_result(units: Units) -> None:
    request = body(min_levels=Levels(confidentiality=8, integrity=8))
    first = negotiate(units, request)
    again = negotiate(units, body(min_levels=Levels(confidentiality=8, integrity=8)))
    assert again is first
    other = negotiate(units, body(min_levels=Levels(confidentiality=10, integrity=10)))
    assert other is not first
    assert other.levels.confidentiality >= 10


def test_a_table_edit_through_the_repository_is_negotiated_afresh(units: Units) -> None:
    request = body(min_levels=Levels(confidentiality=8, integrity=8))
    first = negotiate(units, request)
    chosen = first.suite.encryption
    assert chosen is not None
    with units() as uow:
        table = ratings.get_table(uow=uow, name=TABLE)
        ratings.update_rating(uow=uow, name=TABLE, algorithm=chosen, changes={"performance": 0.1},
                              expected_revision=table.revision, author="test")
        uow.commit()
    changed = negotiate(units, request)
    assert changed is not first
    assert changed.suite.encryption != chosen


def test_an_uncommitted_edit_is_negotiated_by_its_own_unit_of_work_alone(units: Units) -> None:
    request = body(min_levels=Levels(confidentiality=8, integrity=8))
    first = negotiate(units, request)
    chosen = first.suite.encryption
    assert chosen is not None
    with units() as uow:
        table = ratings.get_table(uow=uow, name=TABLE)
        ratings.update_rating(uow=uow, name=TABLE, algorithm=chosen, changes={"performance": 0.1},
                              expected_revision=table.revision, author="test")
        assert run_negotiation(uow=uow, request=request, default_table=TABLE).suite.encryption != chosen
        uow.rollback()
    assert negotiate(units, request).as_dict() == first.as_dict()  # the committed table's choice


def test_a_changed_policy_is_negotiated_afresh(units: Units) -> None:
    document = {"name": "office", "min_levels": {"confidentiality": 3, "integrity": 3}}
    with units() as uow:
        _, revision = policies.create_policy(uow=uow, document=document, author="test")
        uow.commit()
    first = negotiate(units, body(policy="office"))
    assert negotiate(units, body(policy="office")) is first
    with units() as uow:
        policies.replace_policy(uow=uow, name="office", expected_revision=revision, author="test",
                                document={**document, "min_levels": {"confidentiality": 10, "integrity": 10}})
        uow.commit()
    stricter = negotiate(units, body(policy="office"))
    assert stricter is not first
    assert stricter.levels.confidentiality >= 10 > first.levels.confidentiality


def test_unknown_keywords_are_refused_every_time_and_never_cached(units: Units) -> None:
    """Keywords are checked only when a result is made: a refused request leaves nothing to hit."""
    for _ in range(2):
        with pytest.raises(InvalidPolicy, match="nosuchcipher"):
            negotiate(units, body(supports=("aes128gcm16", "nosuchcipher", "x25519", "prfsha256")))
    good = negotiate(units, body(supports=("aes128gcm16", "x25519", "prfsha256")))
    assert negotiate(units, body(supports=("aes128gcm16", "x25519", "prfsha256"))) is good
    with pytest.raises(InvalidPolicy, match="nosuchcipher"):
        negotiate(units, body(supports=("aes128gcm16", "x25519", "prfsha256"), forbids=("nosuchcipher",)))
