"""A migrated SQLite database with the shipped rating tables, copied fresh for each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.resources import SHIPPED_RATINGS_DIR
from app.services.ratings import load_shipped_tables


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("db") / "template.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as session, session.begin():
        load_shipped_tables(session=session, tables=files.load_rating_tables(SHIPPED_RATINGS_DIR))
    engine.dispose()
    return str(path)


@pytest.fixture
def session(migrated: str, tmp_path: Path) -> Iterator[Session]:
    copy = tmp_path / "qoss.db"
    copy.write_bytes(Path(migrated).read_bytes())
    engine = make_engine(f"sqlite:///{copy}")
    with make_session_factory(engine)() as s:
        yield s
    engine.dispose()
