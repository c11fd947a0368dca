"""Rating tables and policies: named documents with their whole revision history.

Optimistic concurrency is decided by the database itself: a write moves the current
revision with ``UPDATE ... WHERE current_revision = :expected``; zero rows means someone
else wrote first (StaleRevision). The unique (object, revision) constraint is the backstop.
Repositories flush, never commit.

Negotiations read their rating tables through the process's :class:`TableCache`, held by the
session factory's ``info``: the repository's own writes make it forget a table, the other
replicas' change notices too (:mod:`app.adapters.db.notices`).
"""

from __future__ import annotations

import builtins
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Update, bindparam, delete, event, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.hot import HotStatement, bare, session_cursor
from app.adapters.db.models import PolicyRevisionRow, PolicyRow, RatingTableRevisionRow, RatingTableRow, utcnow
from app.adapters.db.notices import publish
from app.adapters.db.read_cache import ReadCache
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ratings import RatingTable
from app.domain.revisions import diff_policies, diff_tables

__all__ = ["TABLE_CACHE", "PolicyRepository", "RatingTableRepository", "TableCache"]

#: Where a session factory's ``info`` holds the process's :class:`TableCache`.
TABLE_CACHE = "qoss.table_cache"
#: Where a session's own ``info`` holds the names of the tables it changed: it reads those from
#: the database (its uncommitted edit included) and never lends them to the cache.
_CHANGED = "qoss.tables_changed"
_R = TypeVar("_R")


class TableCache(ReadCache[str, RatingTable]):
    """Parsed rating tables by name (:class:`~app.adapters.db.read_cache.ReadCache`), for
    :meth:`RatingTableRepository.recent`: a negotiation normally reads no table at all.

    A table is trusted for ``ttl`` seconds after its revision was read; past that, one cheap
    query reads its current revision and the table is read again only if that changed (so one
    revision is one object, whatever the TTL, 0 included). This process's changes forget a table
    at once and again when they commit; another replica's are seen within ``ttl`` (on PostgreSQL
    at once, by its change notice).

    It keeps the last ``results`` values made from its tables (:meth:`memo`: the negotiations'
    results, the engine being a pure function of its request, its tables and its policies).
    """

    checked = True

    def __init__(self, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic, results: int = 256) -> None:
        super().__init__(ttl=ttl, clock=clock)
        self._size = results
        self._results_lock = threading.Lock()
        self._results: OrderedDict[tuple[Hashable, tuple[int, ...]], tuple[Any, tuple[RatingTable, ...]]] = (
            OrderedDict())

    def memo(self, key: Hashable, tables: Sequence[RatingTable], make: Callable[[], _R]) -> _R:
        """``make()``, or what it made before for ``key`` and these very tables.

        Tables are keyed by identity: the cache hands out one object per table revision and a new
        object for any change, and an entry holds its tables, so their ids cannot be reused while
        it lives. What ``make`` raises is raised, nothing kept.
        """
        full = (key, tuple(id(t) for t in tables))
        with self._results_lock:
            found = self._results.get(full)
            if found is not None:
                self._results.move_to_end(full)
                return cast(_R, found[0])
        made = make()
        with self._results_lock:
            self._results[full] = (made, tuple(tables))
            self._results.move_to_end(full)
            while len(self._results) > self._size:
                self._results.popitem(last=False)
        return made

    def clear(self) -> None:
        super().clear()
        with self._results_lock:
            self._results.clear()


_CURRENT: dict[type[Any], HotStatement] = {}


def _current_revision(model: type[Any]) -> HotStatement:
    """A named object's current revision, compiled once (app.adapters.db.hot): read on every set-up."""
    found = _CURRENT.get(model)
    if found is None:
        found = _CURRENT.setdefault(model, HotStatement(
            lambda _: select(model.current_revision).where(model.name == bindparam("name"))))
    return found


def _rowcount(session: Session, statement: Update) -> int:
    """Execute a bulk UPDATE and return how many rows it matched."""
    result = cast(CursorResult[Any], session.execute(statement.execution_options(synchronize_session=False)))
    return result.rowcount


class _Revisioned:
    """Named documents with full revision history (rating tables, policies).

    Each object is a row (name, current revision) and one revision row per revision with
    the whole document and its changes against the revision before. Subclasses name their
    two models, the revision row's key column, the noun used in messages and the diff.
    """

    _row_model: Any
    _rev_model: Any
    _owner: str
    _noun: str
    #: The kind of its change notices to other replicas (app.adapters.db.notices).
    _notice: str
    _diff: Callable[[dict[str, Any] | None, dict[str, Any]], builtins.list[dict[str, Any]]]

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``.

        Args:
            session: The unit of work; committed by the caller, never here.
        """
        self.session = session

    def _row(self, name: str) -> Any:
        row = self.session.scalar(select(self._row_model).where(self._row_model.name == name))
        if row is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        return row

    def _owner_of(self) -> Any:
        return getattr(self._rev_model, self._owner)

    def _content(self, owner_id: int, revision: int) -> dict[str, Any] | None:
        content = self.session.scalar(
            select(self._rev_model.content).where(self._owner_of() == owner_id, self._rev_model.revision == revision))
        return cast(dict[str, Any] | None, content)

    def _revision_content(self, name: str, revision: int | None = None) -> tuple[dict[str, Any], int]:
        """A revision's document (the current one by default) and its number."""
        row = self._row(name)
        wanted = row.current_revision if revision is None else revision
        content = self._content(row.id, wanted)
        if content is None:
            raise NotFound(f"{self._noun} {name!r} has no revision {wanted}")
        return content, wanted

    def _create(self, name: str, content: dict[str, Any], *, author: str, message: str) -> int:
        """Store a new object at revision 1 (nothing is written if the name is taken)."""
        if self.session.scalar(select(self._row_model.id).where(self._row_model.name == name)) is not None:
            raise AlreadyExists(f"{self._noun} {name!r} exists already")
        try:
            with self.session.begin_nested():
                row = self._row_model(name=name, current_revision=1)
                self.session.add(row)
                self.session.flush()
                self.session.add(self._rev_model(**{self._owner: row.id}, revision=1, author=author,
                                                 message=message, content=content,
                                                 changes=type(self)._diff(None, content)))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"{self._noun} {name!r} exists already") from exc
        self._changed(name)
        return 1

    def _changed(self, name: str) -> None:
        """This session wrote ``name`` (a subclass with a cache forgets it)."""

    def _update(self, name: str, content: dict[str, Any], *, expected_revision: int, author: str,
                message: str) -> int:
        """Store ``content`` as the next revision if ``expected_revision`` is still current."""
        row_id = self.session.scalar(select(self._row_model.id).where(self._row_model.name == name))
        if row_id is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        new = expected_revision + 1
        try:
            with self.session.begin_nested():
                moved = _rowcount(self.session, (
                    update(self._row_model)
                    .where(self._row_model.id == row_id, self._row_model.current_revision == expected_revision)
                    .values(current_revision=new, updated_at=utcnow())
                ))
                if moved == 1:
                    changes = type(self)._diff(self._content(row_id, expected_revision), content)
                    self.session.add(self._rev_model(**{self._owner: row_id}, revision=new, author=author,
                                                     message=message, content=content, changes=changes))
                    self.session.flush()
        except IntegrityError as exc:
            raise StaleRevision(name, expected_revision, new) from exc
        if moved != 1:
            raise StaleRevision(name, expected_revision, self.current_revision(name))
        publish(self.session, self._notice, name)
        self._changed(name)
        return new

    def current_revision(self, name: str) -> int:
        """The current revision number, in one cheap query (for cache validation).

        Raises:
            NotFound: No such object.
        """
        if bare(self.session):
            with session_cursor(self.session) as cursor:
                found = cursor.first(_current_revision(self._row_model), {"name": name})
            revision = found[0] if found is not None else None
        else:  # this session holds rows (maybe changed): the ORM reads through them
            revision = self.session.scalar(select(self._row_model.current_revision)
                                           .where(self._row_model.name == name))
        if revision is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        return cast(int, revision)

    def _current(self) -> builtins.list[tuple[Any, dict[str, Any]]]:
        """Every object with its current document, by name."""
        rows = self.session.execute(
            select(self._row_model, self._rev_model.content)
            .join(self._rev_model, (self._owner_of() == self._row_model.id)
                  & (self._rev_model.revision == self._row_model.current_revision))
            .order_by(self._row_model.name)
        ).all()
        return [(r, c) for r, c in rows]

    def _revision_rows(self, name: str) -> builtins.list[Any]:
        row = self._row(name)
        return list(self.session.scalars(
            select(self._rev_model).where(self._owner_of() == row.id).order_by(self._rev_model.revision)).all())

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """The history, oldest first.

        Returns:
            ``{"revision", "author", "created_at" (ISO 8601, UTC), "message", "changes"}``
            per revision, ``changes`` against the revision before (the subclass's diff).

        Raises:
            NotFound: No such object.
        """
        return [
            {"revision": r.revision, "author": r.author, "created_at": r.created_at.isoformat(),
             "message": r.message, "changes": r.changes}
            for r in self._revision_rows(name)
        ]

    def delete(self, name: str) -> None:
        """Delete an object and its whole history.

        Raises:
            NotFound: No such object.
        """
        row = self._row(name)
        self.session.execute(delete(self._rev_model).where(self._owner_of() == row.id))
        self.session.delete(row)
        self.session.flush()
        publish(self.session, self._notice, name)
        self._changed(name)


class RatingTableRepository(_Revisioned):
    """Rating tables with full revision history.

    Every revision stores the whole ``RatingTable.as_dict()`` document and its changes
    against the previous revision. The repository flushes and never commits: the caller's
    (request-scoped) session commits or rolls back.
    """

    _row_model = RatingTableRow
    _rev_model = RatingTableRevisionRow
    _owner = "table_id"
    _noun = "rating table"
    _notice = "table"
    _diff = staticmethod(diff_tables)

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session`` (committed by the caller, never here); its factory's
        :class:`TableCache`, if it has one, spares :meth:`recent` its reads."""
        super().__init__(session)
        self._cache: TableCache | None = session.info.get(TABLE_CACHE)

    def recent(self, name: str, *, check: bool = False) -> RatingTable:
        """The current revision of a table as this process read it lately (what a negotiation
        reads): within the cache's TTL no query, past it one cheap query for its revision.

        Args:
            name: The table.
            check: Read its current revision now (one cheap query), whatever the TTL.

        A table this session changed, and every table when the factory has no cache, is read as
        :meth:`get` reads it.

        Raises:
            NotFound: No such table.
        """
        cache = self._cache
        if cache is None or name in self.session.info.get(_CHANGED, ()):
            return self.get(name)
        if not check:
            found = cache.fresh(name)
            if found is not None:
                return found
        last = cache.last(name)
        table = last if last is not None and last.revision == self.current_revision(name) else self.get(name)
        cache.keep(name, table)
        return table

    def memo(self, key: Hashable, tables: Sequence[RatingTable], make: Callable[[], _R]) -> _R:
        """``make()``, or what it made before for ``key`` and these very tables, as
        :meth:`recent` returned them (:meth:`TableCache.memo`); nothing is kept for a session that
        changed a table, nor without a cache.

        Raises:
            Exception: What ``make`` raises (nothing is kept).
        """
        cache = self._cache
        if cache is None or self.session.info.get(_CHANGED):
            return make()
        return cache.memo(key, tables, make)

    def _changed(self, name: str) -> None:
        cache = self._cache
        if cache is None:
            return
        cache.forget(name)
        changed: set[str] | None = self.session.info.get(_CHANGED)
        if changed is None:
            changed = self.session.info[_CHANGED] = set()
            event.listen(self.session, "after_commit", _forget_changed, once=True)
        changed.add(name)

    def create(self, table: RatingTable, *, author: str, message: str = "") -> int:
        """Store a new table at revision 1.

        Args:
            table: The table; its ``revision`` is ignored.
            author: Who made it.
            message: Why, for the history.

        Returns:
            The new revision, 1.

        Raises:
            AlreadyExists: A table of that name exists (nothing is written: the rows go in
                under a savepoint that is rolled back on the unique-name violation).
        """
        return self._create(table.name, table.as_dict(), author=author, message=message)

    def get(self, name: str) -> RatingTable:
        """The current revision of a table, its ``revision`` set.

        Raises:
            NotFound: No such table.
        """
        content, revision = self._revision_content(name)
        return RatingTable.from_dict(content, revision=revision)

    def get_revision(self, name: str, revision: int) -> RatingTable:
        """A past (or the current) revision of a table.

        Raises:
            NotFound: No such table, or no such revision of it.
        """
        content, _ = self._revision_content(name, revision)
        return RatingTable.from_dict(content, revision=revision)

    def list(self) -> builtins.list[dict[str, Any]]:
        """A summary of every table, by name.

        Returns:
            ``{"name", "revision", "description", "ratings" (count), "updated_at" (ISO 8601)}``
            per table.
        """
        return [
            {"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
             "ratings": len(c.get("ratings", [])), "updated_at": r.updated_at.isoformat()}
            for r, c in self._current()
        ]

    def update(self, table: RatingTable, *, expected_revision: int, author: str, message: str = "") -> int:
        """Store ``table`` as the next revision if ``expected_revision`` is still current.

        The check is one atomic ``UPDATE ... WHERE current_revision = :expected`` in the
        database, so of concurrent writers based on the same revision exactly one wins.
        The unique (table, revision) constraint is the backstop.

        Args:
            table: The new content; ``table.name`` names the table to update.
            expected_revision: The revision the caller based its edit on (If-Match).
            author: Who made the edit.
            message: Why, for the history.

        Returns:
            The new revision, ``expected_revision + 1``.

        Raises:
            NotFound: No such table.
            StaleRevision: Another write came first (nothing is written).
        """
        return self._update(table.name, table.as_dict(), expected_revision=expected_revision, author=author,
                            message=message)


def _forget_changed(session: Session) -> None:
    """The tables ``session`` changed are committed: the cache forgets them again (a read another
    session made between the change and its commit may have kept the revision before) and the
    session reads through the cache once more."""
    cache: TableCache | None = session.info.get(TABLE_CACHE)
    for name in session.info.pop(_CHANGED, ()):
        if cache is not None:
            cache.forget(name)


class PolicyRepository(_Revisioned):
    """Policies with full revision history, like :class:`RatingTableRepository`."""

    _row_model = PolicyRow
    _rev_model = PolicyRevisionRow
    _owner = "policy_id"
    _noun = "policy"
    _notice = "policy"
    _diff = staticmethod(diff_policies)

    def create(self, policy: Policy, *, author: str, message: str = "created") -> int:
        """Store a new policy at revision 1.

        Raises:
            AlreadyExists: A policy of that name exists (nothing is written).
        """
        return self._create(policy.name, policy.as_dict(), author=author, message=message)

    def get(self, name: str) -> tuple[Policy, int]:
        """The current revision of a policy and its number.

        Raises:
            NotFound: No such policy.
        """
        content, revision = self._revision_content(name)
        return Policy.from_dict(content), revision

    def get_revision(self, name: str, revision: int) -> Policy:
        """A past (or the current) revision of a policy.

        Raises:
            NotFound: No such policy, or no such revision of it.
        """
        content, _ = self._revision_content(name, revision)
        return Policy.from_dict(content)

    def list(self) -> builtins.list[dict[str, Any]]:
        """A summary of every policy, by name.

        Returns:
            ``{"name", "revision", "description", "min_levels", "objectives"}`` per policy.
        """
        return [{"name": r.name, "revision": r.current_revision, "description": c.get("description", ""),
                 "min_levels": c.get("min_levels"), "objectives": c.get("objectives")} for r, c in self._current()]

    def update(self, policy: Policy, *, expected_revision: int, author: str, message: str = "replaced") -> int:
        """Store ``policy`` as the next revision if ``expected_revision`` is still current
        (the same atomic compare-and-set as :meth:`RatingTableRepository.update`).

        Raises:
            NotFound: No such policy.
            StaleRevision: Another write came first (nothing is written).
        """
        return self._update(policy.name, policy.as_dict(), expected_revision=expected_revision, author=author,
                            message=message)
