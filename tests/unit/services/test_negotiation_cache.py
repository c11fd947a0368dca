"""Repeated negotiations reuse their result until a table or policy they read changes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.services import negotiation, policies, ratings
from app.services.negotiation import MinLevelsIn, NegotiationIn, PeerIn, run_negotiation
from app.services.ratings import TableCache, load_shipped_tables
from app.settings import REPO_ROOT

TABLE = "standards-2026"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("db") / "template.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as session, session.begin():
        load_shipped_tables(session=session, tables=files.load_rating_tables(REPO_ROOT / "ratings"))
    engine.dispose()
    return str(path)


@pytest.fixture
def session(migrated: str, tmp_path: Path) -> Iterator[Session]:
    copy = tmp_path / "qoss.db"
    copy.write_bytes(Path(migrated).read_bytes())
    engine = make_engine(f"sqlite:///{copy}")
    negotiation._RESULTS.clear()
    with make_session_factory(engine)() as s:
        yield s
    engine.dispose()


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
