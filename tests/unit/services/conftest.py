"""Service tests run on the in-memory unit of work (``tests/fakes/uow.py``): no database.
The same stores are held to the SQL adapters' behaviour by ``tests/contract``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.adapters import files
from app.services.ratings import load_shipped_tables
from app.settings import SHIPPED_RATINGS_DIR
from tests.fakes.uow import FakeDatabase, FakeUnitOfWork

_SHIPPED = files.load_rating_tables(SHIPPED_RATINGS_DIR)


@pytest.fixture
def database() -> FakeDatabase:
    """A fresh in-memory database holding the shipped rating tables."""
    db = FakeDatabase()
    with db.unit() as uow:
        load_shipped_tables(uow=uow, tables=_SHIPPED)
        uow.commit()
    return db


@pytest.fixture
def uow(database: FakeDatabase) -> Iterator[FakeUnitOfWork]:
    """One unit of work on :func:`database` (committed by the test where it matters)."""
    with database.unit() as unit:
        yield unit
