"""An in-memory unit of work with the stores of ``app.domain.ports``, for service tests
that need neither SQLite nor PostgreSQL.

:class:`FakeDatabase` holds the committed state. A :class:`FakeUnitOfWork` reads a copy
of it; its first write takes the database's one writer lock (as SQLite's single writer,
refreshing the copy to what is committed now), ``commit`` writes the copy back and lets
the lock go; ``rollback`` and leaving ``with`` uncommitted throw the copy away. The stores
raise the domain's errors exactly where the SQL repositories do: the contract tests
(``tests/contract``) hold both to the same behaviour.
"""

from __future__ import annotations

import builtins
import copy
import threading
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from app.domain.auth import TokenRecord
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ports import StoredAnswer
from app.domain.ratings import RatingTable
from app.domain.revisions import diff_policies, diff_tables
from app.domain.sessions import SessionRecord
from app.domain.tunnels import Gateway, TunnelRecord, TunnelState, check_transition

__all__ = ["FakeDatabase", "FakeUnitOfWork"]

D = TypeVar("D")
_T = TypeVar("_T")
R = TypeVar("R")


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Document:
    current: int
    updated_at: datetime
    #: revision -> (content, author, message, created_at)
    revisions: dict[int, tuple[dict[str, Any], str, str, datetime]] = field(default_factory=dict)


@dataclass
class _State:
    tables: dict[str, _Document] = field(default_factory=dict)
    policies: dict[str, _Document] = field(default_factory=dict)
    gateways: dict[str, Gateway] = field(default_factory=dict)
    tunnels: dict[str, TunnelRecord] = field(default_factory=dict)
    tokens: dict[str, TokenRecord] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    audit: list[dict[str, Any]] = field(default_factory=list)
    idempotency: dict[tuple[str, str], StoredAnswer] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    event_seq: int = 0
    server_keys: dict[str, str] = field(default_factory=dict)
    shipped: set[tuple[str, str]] = field(default_factory=set)


class FakeDatabase:
    """The committed state, shared by the units of work made from it."""

    def __init__(self) -> None:
        self.state = _State()
        self.lock = threading.Lock()  # guards ``state``
        self.writer = threading.Lock()  # one unit of work writes at a time
        self.commits = 0

    def unit(self) -> FakeUnitOfWork:
        """A new unit of work on this database (a ``UnitOfWorkFactory``)."""
        return FakeUnitOfWork(self)


class _Revisioned(Generic[D]):
    """Named documents with their history (the shape of ``app.adapters.db.repositories.revisioned``)."""

    _noun = "document"

    def __init__(self, uow: FakeUnitOfWork, attribute: str, to_dict: Callable[[D], dict[str, Any]],
                 from_dict: Callable[[dict[str, Any], int], D], name_of: Callable[[D], str],
                 diff: Callable[[dict[str, Any] | None, dict[str, Any]], builtins.list[dict[str, Any]]]) -> None:
        self._uow, self._attribute = uow, attribute
        self._to_dict, self._from_dict, self._name_of, self._diff = to_dict, from_dict, name_of, diff

    @property
    def _docs(self) -> dict[str, _Document]:
        docs: dict[str, _Document] = getattr(self._uow.read(), self._attribute)
        return docs

    def _writable(self) -> dict[str, _Document]:
        docs: dict[str, _Document] = getattr(self._uow.write(), self._attribute)
        return docs

    def _doc(self, name: str, docs: dict[str, _Document] | None = None) -> _Document:
        doc = (self._docs if docs is None else docs).get(name)
        if doc is None:
            raise NotFound(f"{self._noun} {name!r} does not exist")
        return doc

    def current_revision(self, name: str) -> int:
        return self._doc(name).current

    def get_revision(self, name: str, revision: int) -> D:
        doc = self._doc(name)
        if revision not in doc.revisions:
            raise NotFound(f"{self._noun} {name!r} has no revision {revision}")
        return self._from_dict(copy.deepcopy(doc.revisions[revision][0]), revision)

    def create(self, document: D, *, author: str, message: str = "") -> int:
        name, docs = self._name_of(document), self._writable()
        if name in docs:
            raise AlreadyExists(f"{self._noun} {name!r} exists already")
        now = _now()
        docs[name] = _Document(1, now, {1: (self._to_dict(document), author, message, now)})
        return 1

    def update(self, document: D, *, expected_revision: int, author: str, message: str = "") -> int:
        doc = self._doc(self._name_of(document), self._writable())
        if doc.current != expected_revision:
            raise StaleRevision(self._name_of(document), expected_revision, doc.current)
        now = _now()
        doc.current = expected_revision + 1
        doc.updated_at = now
        doc.revisions[doc.current] = (self._to_dict(document), author, message, now)
        return doc.current

    def delete(self, name: str) -> None:
        docs = self._writable()
        self._doc(name, docs)
        del docs[name]

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        doc, history, previous = self._doc(name), [], None
        for revision in sorted(doc.revisions):
            content, author, message, at = doc.revisions[revision]
            history.append({"revision": revision, "author": author, "created_at": at.isoformat(), "message": message,
                            "changes": self._diff(previous, content)})
            previous = content
        return history

    def _current(self) -> builtins.list[tuple[str, _Document, dict[str, Any]]]:
        return [(name, doc, doc.revisions[doc.current][0]) for name, doc in sorted(self._docs.items())]


class FakeRatingTables(_Revisioned[RatingTable]):
    _noun = "rating table"

    def __init__(self, uow: FakeUnitOfWork) -> None:
        super().__init__(uow, "tables", lambda t: t.as_dict(), lambda c, r: RatingTable.from_dict(c, revision=r),
                         lambda t: t.name, diff_tables)

    def get(self, name: str) -> RatingTable:
        return self.get_revision(name, self.current_revision(name))

    def recent(self, name: str, *, check: bool = False) -> RatingTable:
        """As :meth:`get`: the fake keeps nothing."""
        return self.get(name)

    def memo(self, key: Hashable, tables: Sequence[RatingTable], make: Callable[[], R]) -> R:
        """``make()``: the fake keeps nothing."""
        return make()

    def list(self) -> builtins.list[dict[str, Any]]:
        return [{"name": name, "revision": doc.current, "description": c.get("description", ""),
                 "ratings": len(c.get("ratings", [])), "updated_at": doc.updated_at.isoformat()}
                for name, doc, c in self._current()]


class FakePolicies(_Revisioned[Policy]):
    _noun = "policy"

    def __init__(self, uow: FakeUnitOfWork) -> None:
        super().__init__(uow, "policies", lambda p: p.as_dict(), lambda c, _r: Policy.from_dict(c), lambda p: p.name,
                         diff_policies)

    def create(self, document: Policy, *, author: str, message: str = "created") -> int:
        return super().create(document, author=author, message=message)

    def update(self, document: Policy, *, expected_revision: int, author: str, message: str = "replaced") -> int:
        return super().update(document, expected_revision=expected_revision, author=author, message=message)

    def get(self, name: str) -> tuple[Policy, int]:
        revision = self.current_revision(name)
        return self.get_revision(name, revision), revision

    def list(self) -> builtins.list[dict[str, Any]]:
        return [{"name": name, "revision": doc.current, "description": c.get("description", ""),
                 "min_levels": c.get("min_levels"), "objectives": c.get("objectives")}
                for name, doc, c in self._current()]


class _Store:
    """A store reading its part of the unit of work's copy (``read``) or writing it (``write``)."""

    _attribute = ""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self._uow = uow

    def _read(self) -> Any:
        return getattr(self._uow.read(), self._attribute)

    def _write(self) -> Any:
        return getattr(self._uow.write(), self._attribute)


class FakeGateways(_Store):
    _attribute = "gateways"

    def create(self, gateway: Gateway) -> None:
        gateways = self._write()
        if gateway.name in gateways:
            raise AlreadyExists(f"gateway {gateway.name!r} exists already")
        gateways[gateway.name] = gateway

    def get(self, name: str) -> Gateway:
        gateway: Gateway | None = self._read().get(name)
        if gateway is None:
            raise NotFound(f"gateway {name!r} does not exist")
        return gateway

    def get_many(self, names: Collection[str]) -> dict[str, Gateway]:
        return {name: self.get(name) for name in names}

    def list(self) -> builtins.list[Gateway]:
        gateways = self._read()
        return [gateways[n] for n in sorted(gateways)]

    def update(self, gateway: Gateway) -> None:
        stored = self.get(gateway.name)
        self._write()[gateway.name] = replace(stored, backend=gateway.backend, version=gateway.version,
                                              algorithms=gateway.algorithms)

    def delete(self, name: str) -> None:
        self.get(name)
        del self._write()[name]


class FakeTunnels(_Store):
    _attribute = "tunnels"

    def add(self, record: TunnelRecord, *, keep_transaction: bool = True) -> TunnelRecord:
        now = _now().isoformat()
        stored = replace(record, created_at=now, updated_at=now)
        if record.id in self._read():
            raise AlreadyExists(f"tunnel {record.id!r} exists already")
        self._write()[record.id] = stored
        return stored

    def get(self, tunnel_id: str) -> TunnelRecord:
        record: TunnelRecord | None = self._read().get(tunnel_id)
        if record is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return record

    def states(self, tunnel_ids: Collection[str]) -> dict[str, TunnelState]:
        records = self._read()
        return {i: records[i].state for i in tunnel_ids if i in records}

    def list(self) -> builtins.list[TunnelRecord]:
        return list(self._read().values())  # insertion order: oldest first

    def joining(self, initiator: str, identity: str, local_identity: str) -> str | None:
        return next((r.id for r in self._read().values() if r.initiator == initiator and r.peer is not None
                     and (r.peer.identity, r.peer.local_identity) == (identity, local_identity)), None)

    def with_peer(self, site: str) -> builtins.list[TunnelRecord]:
        return [r for r in self._read().values() if r.peer is not None and r.peer.site == site]

    def ids_by_peer(self) -> dict[str, builtins.list[str]]:
        found: dict[str, builtins.list[str]] = {}
        for r in self._read().values():
            if r.peer is not None and r.peer.site is not None:
                found.setdefault(r.peer.site, []).append(r.id)
        return found

    def page(self, *, limit: int, after: tuple[str, str] | None = None,
             state: TunnelState | None = None) -> builtins.list[TunnelRecord]:
        def key(record: TunnelRecord) -> tuple[datetime, str]:
            return datetime.fromisoformat(record.created_at or ""), record.id

        start = (datetime.fromisoformat(after[0]), after[1]) if after is not None else None
        found = sorted((r for r in self._read().values() if state is None or r.state == state), key=key)
        return [r for r in found if start is None or key(r) > start][:limit]

    def set_state(self, tunnel_id: str, state: TunnelState, detail: str) -> None:
        record = self.get(tunnel_id)
        self._write()[tunnel_id] = replace(record, state=check_transition(record.state, state), detail=detail,
                                           updated_at=_now().isoformat())

    def set_negotiation(self, tunnel_id: str, negotiation: Mapping[str, Any], provenance: Mapping[str, Any] | None,
                        detail: str) -> None:
        record = self.get(tunnel_id)
        check_transition(record.state, TunnelState.UP)
        self._write()[tunnel_id] = replace(record, negotiation=copy.deepcopy(dict(negotiation)),
                                           provenance=copy.deepcopy(dict(provenance)) if provenance else None,
                                           state=TunnelState.UP, detail=detail, updated_at=_now().isoformat())

    def set_provenance(self, tunnel_id: str, provenance: Mapping[str, Any], *, unless_changed_since: str) -> bool:
        records = self._write()
        record = records.get(tunnel_id)
        if record is None or record.updated_at != unless_changed_since:
            return False
        records[tunnel_id] = replace(record, provenance=copy.deepcopy(dict(provenance)), updated_at=_now().isoformat())
        return True

    def delete(self, tunnel_id: str) -> None:
        self.get(tunnel_id)
        del self._write()[tunnel_id]


class FakeTokens(_Store):
    _attribute = "tokens"

    def add(self, record: TokenRecord, *, created_by: str) -> None:
        self._write()[record.id] = record

    def find(self, token_id: str) -> TokenRecord | None:
        found: TokenRecord | None = self._read().get(token_id)
        return found

    def list(self) -> builtins.list[TokenRecord]:
        return sorted(self._read().values(), key=lambda t: t.created_at)

    def revoke(self, token_id: str) -> None:
        record = self.find(token_id)
        if record is None:
            raise NotFound(f"token {token_id!r} does not exist")
        if record.revoked_at is None:
            self._write()[token_id] = replace(record, revoked_at=_now())


class FakeSessions(_Store):
    _attribute = "sessions"

    def add(self, record: SessionRecord) -> None:
        if record.token_id is not None and record.token_id not in self._uow.read().tokens:
            raise ValueError(f"no token {record.token_id!r}: a session belongs to a token (a foreign key)")
        self._write()[record.id_hash] = record

    def find(self, id_hash: str) -> SessionRecord | None:
        found: SessionRecord | None = self._read().get(id_hash)
        return found

    def delete(self, id_hash: str) -> None:
        if id_hash in self._read():
            del self._write()[id_hash]

    def delete_ended(self, now: datetime) -> int:
        ended = [h for h, r in self._read().items() if not r.live(now)]
        if ended:
            sessions = self._write()
            for h in ended:
                del sessions[h]
        return len(ended)


class FakeAudit(_Store):
    _attribute = "audit"

    def append(self, **fields: Any) -> None:
        self.append_many([fields])

    def append_many(self, records: Sequence[Mapping[str, Any]]) -> None:
        entries = self._write()
        for r in records:
            entry = {"token_id": None, "token_name": None, "client_request_id": None, "detail": "", **r}
            entry["at"] = (r.get("at") or _now()).isoformat()
            entry["id"] = len(entries) + 1
            entries.append(entry)

    def list(self, *, limit: int = 100, before_id: int | None = None, after_id: int | None = None,
             outcome: int | None = None, action: str | None = None) -> builtins.list[dict[str, Any]]:
        newest = [e for e in reversed(self._read()) if (before_id is None or e["id"] < before_id)
                  and (after_id is None or e["id"] > after_id)
                  and (outcome is None or e["outcome"] == outcome) and (action is None or e["action"] == action)]
        return [dict(e) for e in newest[:limit]]


class FakeEvents(_Store):
    _attribute = "events"

    def append(self, kind: str, subject: str, data: Mapping[str, Any], *, scope: str | None = None) -> None:
        state = self._uow.write()
        state.event_seq += 1
        state.events.append({"id": state.event_seq, "at": _now().isoformat(), "kind": kind, "subject": subject[:200],
                       "data": copy.deepcopy(dict(data)), "scope": scope})

    def after(self, last_id: int, *, scopes: Collection[str] | None, limit: int = 500,
              kinds: Collection[str] | None = None) -> builtins.list[dict[str, Any]]:
        seen = [e for e in self._read() if e["id"] > last_id and (scopes is None or e["scope"] is None
                                                                   or e["scope"] in scopes)
                and (kinds is None or e["kind"] in kinds)]
        return [{k: v for k, v in e.items() if k != "scope"} for e in seen[:limit]]

    def last_id(self) -> int:
        events = self._read()
        return int(events[-1]["id"]) if events else 0

    def prune(self, before: datetime) -> int:
        events = self._write()
        kept = [e for e in events if datetime.fromisoformat(e["at"]) >= before]
        gone = len(events) - len(kept)
        events[:] = kept
        return gone


class FakeIdempotency(_Store):
    _attribute = "idempotency"

    def find(self, token_id: str, key: str) -> StoredAnswer | None:
        found: StoredAnswer | None = self._read().get((token_id, key))
        return found

    def reserve(self, token_id: str, key: str, request_hash: str) -> bool:
        answers = self._write()
        if (token_id, key) in answers:
            return False
        answers[(token_id, key)] = StoredAnswer(request_hash, 0, {}, datetime.now(UTC))
        return True

    def complete(self, token_id: str, key: str, *, status: int, body: dict[str, Any]) -> None:
        answers = self._write()
        found = answers.get((token_id, key))
        if found is not None:
            answers[(token_id, key)] = StoredAnswer(found.request_hash, status, copy.deepcopy(body), found.reserved_at)

    def release(self, token_id: str, key: str) -> None:
        answers = self._write()
        found = answers.get((token_id, key))
        if found is not None and found.status == 0:
            del answers[(token_id, key)]

    def take_over(self, token_id: str, key: str, *, claimed_before: datetime) -> bool:
        answers = self._write()
        found = answers.get((token_id, key))
        if found is None or found.status != 0 or found.reserved_at is None or found.reserved_at >= claimed_before:
            return False
        answers[(token_id, key)] = StoredAnswer(found.request_hash, 0, {}, datetime.now(UTC))
        return True


class FakeServerKeys(_Store):
    _attribute = "server_keys"

    def get_or_create(self, name: str, make: Callable[[], str]) -> str:
        found: str | None = self._read().get(name)
        if found is not None:
            return found
        value: str = self._write().setdefault(name, make())
        return value


class FakeShippedLoads(_Store):
    _attribute = "shipped"

    def loaded(self, kind: str) -> set[str]:
        return {name for k, name in self._read() if k == kind}

    def record(self, kind: str, name: str) -> None:
        self._write().add((kind, name))


class FakeUnitOfWork:
    """A transaction on a :class:`FakeDatabase` (see the module's description).

    Args:
        database: the committed state.
        lock_timeout: seconds a first write waits for another unit of work's commit
            (then ``TimeoutError``, as a database reports a lock it could not get).
    """

    def __init__(self, database: FakeDatabase, lock_timeout: float = 5.0) -> None:
        self.database = database
        self._lock_timeout = lock_timeout
        self._writing = False
        self._state = self._committed()
        self.tables = FakeRatingTables(self)
        self.policies = FakePolicies(self)
        self.gateways = FakeGateways(self)
        self.tunnels = FakeTunnels(self)
        self.tokens = FakeTokens(self)
        self.sessions = FakeSessions(self)
        self.audit = FakeAudit(self)
        self.idempotency = FakeIdempotency(self)
        self.events = FakeEvents(self)
        self.server_keys = FakeServerKeys(self)
        self.shipped = FakeShippedLoads(self)

    def _committed(self) -> _State:
        with self.database.lock:
            return copy.deepcopy(self.database.state)

    def read(self) -> _State:
        """This transaction's view."""
        return self._state

    def write(self) -> _State:
        """This transaction's view, holding the writer lock (taken, and the view refreshed, at the first write)."""
        if not self._writing:
            if not self.database.writer.acquire(timeout=self._lock_timeout):
                raise TimeoutError("another unit of work holds the fake database's writer lock")
            self._writing = True
            self._state = self._committed()
        return self._state

    def _end(self) -> None:
        if self._writing:
            self._writing = False
            self.database.writer.release()
        self._state = self._committed()

    def commit(self) -> None:
        if self._writing:
            with self.database.lock:
                self.database.state = copy.deepcopy(self._state)
                self.database.commits += 1
        self._end()

    def rollback(self) -> None:
        self._end()

    def commit_with(self, work: Callable[[FakeUnitOfWork], _T]) -> _T:
        """``work(self)`` and a commit (a fake database never groups writers)."""
        result = work(self)
        self.commit()
        return result

    def __enter__(self) -> FakeUnitOfWork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.rollback()
