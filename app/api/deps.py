"""Dependencies, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker

from app.services.ratings import TableCache
from app.services.tunnels import ViciFactory
from app.settings import Settings

__all__ = [
    "ActorDep",
    "CacheDep",
    "IfMatchDep",
    "ReadSessionDep",
    "SessionDep",
    "SettingsDep",
    "ViciDep",
    "get_read_session",
    "get_session",
]


def get_session(request: Request) -> Iterator[Session]:
    """A unit of work per request: commit on success, roll back on any error."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


async def get_read_session(request: Request) -> AsyncIterator[Session]:
    """A read-only unit of work: never commits (SQLite: deferred BEGIN, readers never queue).

    Made on the event loop (no thread hop); nothing is queried until the route uses it.
    """
    factory: sessionmaker[Session] = request.app.state.read_session_factory
    session = factory()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_cache(request: Request) -> TableCache:
    cache: TableCache = request.app.state.table_cache
    return cache


async def get_vici(request: Request) -> ViciFactory:
    factory: ViciFactory = request.app.state.vici_factory
    return factory


async def get_actor(
    x_qoss_actor: Annotated[str | None, Header(max_length=64, pattern=r"^[A-Za-z0-9@._:-]+$")] = None,
) -> str:
    """Who makes a change (recorded in revisions); tokens replace this header later."""
    return x_qoss_actor or "anonymous"


async def get_if_match(if_match: Annotated[str | None, Header()] = None) -> int:
    """The revision a write is based on, from ``If-Match: "<revision>"`` (428 without it)."""
    if if_match is None:
        raise HTTPException(428, "If-Match with the revision's ETag is required for this write")
    value = if_match.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    if not value.isdigit() or len(value) > 12:
        raise HTTPException(428, "If-Match must be an ETag of this API, e.g. \"3\"")
    return int(value)


SessionDep = Annotated[Session, Depends(get_session)]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
CacheDep = Annotated[TableCache, Depends(get_cache)]
ActorDep = Annotated[str, Depends(get_actor)]
IfMatchDep = Annotated[int, Depends(get_if_match)]
ViciDep = Annotated[ViciFactory, Depends(get_vici)]
