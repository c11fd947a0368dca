"""What the services need from the world, as protocols: the stores behind a unit of work
(the event log among them), the unit of work itself, the clock and the metrics (a strongSwan
charon: ``app.domain.charon_port``).

Services are written against these and nothing concrete: the database adapters
(``app.adapters.db.unit_of_work``) and the in-memory fakes of ``tests/fakes`` satisfy them,
and the same contract tests run against the real adapters and the fakes (``tests/contract``).

A unit of work is one transaction: its stores flush, never commit; whoever opened the unit
of work commits it or rolls it back. Every store raises the domain's errors (``NotFound``,
``AlreadyExists``, ``StaleRevision``), never a database's.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from app.domain.auth import TokenRecord
from app.domain.peering import Peer, PeerState, UnheardTeardown
from app.domain.policies import Policy
from app.domain.ratings import RatingTable
from app.domain.sessions import SessionRecord
from app.domain.tunnels import Gateway, TunnelRecord, TunnelState

__all__ = [
    "NO_METRICS",
    "AuditStore",
    "Clock",
    "EventStore",
    "GatewayStore",
    "IdempotencyStore",
    "Metrics",
    "PeerStore",
    "PolicyStore",
    "RatingTableStore",
    "RevisionedStore",
    "ServerKeyStore",
    "SessionStore",
    "ShippedLoadStore",
    "StoredAnswer",
    "TokenStore",
    "Transaction",
    "TunnelStore",
    "UnitOfWork",
    "UnitOfWorkFactory",
    "error_label",
]

D = TypeVar("D")
W = TypeVar("W")


class RevisionedStore(Protocol[D]):
    """Named documents with their whole history; a write names the revision it was based on.

    ``update`` is a compare-and-set: of concurrent writers based on the same revision exactly
    one wins, the others get ``StaleRevision`` and nothing of theirs is written.
    """

    def current_revision(self, name: str) -> int:
        """The current revision number (``NotFound`` if there is no such document)."""
        ...

    def get_revision(self, name: str, revision: int) -> D:
        """A past (or the current) revision (``NotFound``: no such document or revision)."""
        ...

    def create(self, document: D, *, author: str, message: str = ...) -> int:
        """Store a new document at revision 1 (``AlreadyExists`` if the name is taken)."""
        ...

    def update(self, document: D, *, expected_revision: int, author: str, message: str = ...) -> int:
        """Store the next revision if ``expected_revision`` is still current; returns it."""
        ...

    def delete(self, name: str) -> None:
        """Forget a document and its history (``NotFound`` if there is none)."""
        ...

    def revisions(self, name: str) -> builtins.list[dict[str, Any]]:
        """The history, oldest first: ``{"revision", "author", "created_at", "message", "changes"}``."""
        ...


class RatingTableStore(RevisionedStore[RatingTable], Protocol):
    """Rating tables; a table read carries its ``revision``."""

    def get(self, name: str) -> RatingTable:
        """The current revision of a table."""
        ...

    def recent(self, name: str, *, check: bool = False) -> RatingTable:
        """As :meth:`get`, or as read a moment ago (``check``: its revision read now); for negotiations."""

    def memo(self, key: Hashable, tables: Sequence[RatingTable], make: Callable[[], W]) -> W:
        """``make()``, or what it made for ``key`` from these very tables while current (or nothing kept)."""

    def list(self) -> builtins.list[dict[str, Any]]:
        """``{"name", "revision", "description", "ratings" (count), "updated_at"}`` per table, by name."""
        ...


class PolicyStore(RevisionedStore[Policy], Protocol):
    """Policies (a policy does not carry its revision: ``get`` returns it beside)."""

    def get(self, name: str) -> tuple[Policy, int]:
        """The current revision of a policy and its number."""
        ...

    def list(self) -> builtins.list[dict[str, Any]]:
        """``{"name", "revision", "description", "min_levels", "objectives"}`` per policy, by name."""
        ...


class GatewayStore(Protocol):
    """Registered strongSwan gateways."""

    def create(self, gateway: Gateway) -> None: ...

    def get(self, name: str) -> Gateway: ...

    def get_many(self, names: Collection[str]) -> dict[str, Gateway]:
        """The gateways of ``names``, by name, in one read. Raises NotFound naming one that is missing."""
        ...

    def list(self) -> builtins.list[Gateway]:
        """Every gateway, by name."""
        ...

    def update(self, gateway: Gateway) -> None:
        """Store what was read from it: back end, version, algorithms."""
        ...

    def delete(self, name: str) -> None: ...


class TunnelStore(Protocol):
    """Tunnel records (never a PSK)."""

    def add(self, record: TunnelRecord, *, keep_transaction: bool = True) -> TunnelRecord:
        """Store a new record; returns it with its timestamps. Raises AlreadyExists for a taken id:
        nothing is written, and the transaction goes on; with ``keep_transaction=False`` (one
        statement fewer for a caller that rolls back on it) the transaction must be rolled back."""
        ...

    def get(self, tunnel_id: str) -> TunnelRecord: ...

    def states(self, tunnel_ids: Collection[str]) -> dict[str, TunnelState]:
        """Only the states of those of ``tunnel_ids`` that exist, in one read (cheaper than :meth:`get`)."""
        ...

    def list(self) -> builtins.list[TunnelRecord]:
        """Every tunnel, oldest first."""
        ...

    def joining(self, initiator: str, identity: str, local_identity: str) -> str | None:
        """The id of the oldest tunnel from gateway ``initiator`` whose far end (``peer``) has these
        identities, or None: one read, no record built."""
        ...

    def with_peer(self, site: str) -> builtins.list[TunnelRecord]:
        """The tunnels carried with the peer ``site`` (another qoss), oldest first: one read of
        those alone, not of every tunnel."""
        ...

    def ids_by_peer(self) -> dict[str, builtins.list[str]]:
        """The ids of the tunnels carried with each peer (another qoss), oldest first: one read of
        their ids alone, no record built."""
        ...

    def page(self, *, limit: int, after: tuple[str, str] | None = None,
             state: TunnelState | None = None) -> builtins.list[TunnelRecord]:
        """Up to ``limit`` tunnels, oldest first (by creation time, then id), only those that come
        after ``after`` = (``created_at`` as ISO 8601, id) in that order, and only those in ``state``."""
        ...

    def set_state(self, tunnel_id: str, state: TunnelState, detail: str) -> None: ...

    def set_negotiation(self, tunnel_id: str, negotiation: Mapping[str, Any], provenance: Mapping[str, Any] | None,
                        detail: str) -> None:
        """Record the suite a tunnel runs on now (after a move) and what it was negotiated under; state ``up``."""
        ...

    def set_provenance(self, tunnel_id: str, provenance: Mapping[str, Any], *, unless_changed_since: str) -> bool:
        """Replace a tunnel's provenance if its record's ``updated_at`` is still ``unless_changed_since``
        (in one step: of two writers that read the same record, one succeeds); whether it was replaced."""
        ...

    def delete(self, tunnel_id: str) -> None: ...


class TokenStore(Protocol):
    """API tokens, by their hash only."""

    def add(self, record: TokenRecord, *, created_by: str) -> None: ...

    def find(self, token_id: str) -> TokenRecord | None: ...

    def list(self) -> builtins.list[TokenRecord]:
        """Every token, oldest first."""
        ...

    def revoke(self, token_id: str) -> None:
        """Revoke at once (``NotFound`` if there is no such token; revoking twice keeps the first time)."""
        ...


class SessionStore(Protocol):
    """Console sessions, by the hash of their id only."""

    def add(self, record: SessionRecord) -> None: ...

    def find(self, id_hash: str) -> SessionRecord | None: ...

    def delete(self, id_hash: str) -> None:
        """End one session (nothing happens if there is none)."""
        ...

    def delete_ended(self, now: datetime) -> int:
        """Forget every session that expired before ``now``; returns how many."""
        ...


class AuditStore(Protocol):
    """The append-only audit log."""

    def append(self, **fields: Any) -> None: ...

    def append_many(self, records: Sequence[Mapping[str, Any]]) -> None: ...

    def list(self, *, limit: int = 100, before_id: int | None = None, after_id: int | None = None,
             outcome: int | None = None, action: str | None = None) -> builtins.list[dict[str, Any]]:
        """The newest entries first: older than ``before_id`` (the next page), newer than ``after_id``;
        only those with this ``outcome`` (HTTP status) and ``action`` (method) if given."""
        ...


class EventStore(Protocol):
    """What happened, in order: written in the transaction of the change it tells of."""

    def append(self, kind: str, subject: str, data: Mapping[str, Any], *, scope: str | None = None) -> None:
        """One event; ``scope``: what a token needs to see it (None: any token)."""
        ...

    def after(self, last_id: int, *, scopes: Collection[str] | None, limit: int = ...,
              kinds: Collection[str] | None = None) -> builtins.list[dict[str, Any]]:
        """Events with an id above ``last_id``, oldest first, those ``scopes`` may see (None: all)
        and, given ``kinds``, only of those kinds: ``{"id", "at", "kind", "subject", "data"}``."""
        ...

    def last_id(self) -> int:
        """The newest event's id (0: none yet)."""
        ...

    def prune(self, before: datetime) -> int:
        """Forget events older than ``before``; how many."""
        ...


@dataclass(frozen=True)
class StoredAnswer:
    """What an idempotent request answered: status 0 while it is still running."""

    request_hash: str
    status: int
    body: dict[str, Any]
    #: When the key was claimed (or last taken over).
    reserved_at: datetime | None = None


class IdempotencyStore(Protocol):
    """Answers remembered by (token, Idempotency-Key)."""

    def find(self, token_id: str, key: str) -> StoredAnswer | None: ...

    def reserve(self, token_id: str, key: str, request_hash: str) -> bool:
        """Claim the key (status 0); False if it is claimed already (a concurrent request won)."""
        ...

    def complete(self, token_id: str, key: str, *, status: int, body: dict[str, Any]) -> None:
        """Store the answer of a claimed key."""
        ...

    def release(self, token_id: str, key: str) -> None:
        """Drop a claim that has no answer yet (the request failed: a retry may run)."""
        ...

    def take_over(self, token_id: str, key: str, *, claimed_before: datetime) -> bool:
        """Claim anew a key still unanswered that was claimed before ``claimed_before`` (its
        request's process died); False if it was answered, claimed later, or another won."""
        ...


class ServerKeyStore(Protocol):
    """Random keys of this database, each made once (the first writer's wins a race)."""

    def get_or_create(self, name: str, make: Callable[[], str]) -> str: ...


class ShippedLoadStore(Protocol):
    """Which shipped tables and policies were offered to this database (each name once)."""

    def loaded(self, kind: str) -> set[str]: ...

    def record(self, kind: str, name: str) -> None: ...


class PeerStore(Protocol):
    """Registered peers (other qoss services), and the nonces of their messages."""

    def create(self, peer: Peer) -> Peer: ...

    def get(self, name: str) -> Peer: ...

    def list(self) -> builtins.list[Peer]: ...

    def set_state(self, name: str, state: PeerState) -> Peer: ...

    def first_sight(self, peer: str, nonce: str, *, keep_until: datetime) -> bool: ...

    def keep_unheard(self, teardown: UnheardTeardown) -> None:
        """Keep (or replace: one per tunnel and peer) a teardown a peer did not hear, to tell it again."""
        ...

    def unheard_due(self, now: datetime, limit: int) -> builtins.list[UnheardTeardown]:
        """Up to ``limit`` kept teardowns due by ``now``, the longest due first."""
        ...

    def heard(self, peer: str, tunnel_id: str) -> None:
        """The teardown of ``tunnel_id`` is no longer to be told to ``peer`` (it answered, or it is given up)."""
        ...

    def unheard_counts(self) -> dict[str, int]:
        """How many kept teardowns each peer has not heard yet (peers with none are absent)."""
        ...


class Transaction(Protocol):
    """What every unit of work is: one transaction, committed or rolled back by whoever opened
    it (its stores flush, never commit); leaving ``with`` rolls back what was not committed."""

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def __enter__(self) -> Transaction: ...

    def __exit__(self, *exc: object) -> None:
        """Roll back what was not committed, and let go of the connection."""
        ...


class UnitOfWork(Transaction, Protocol):
    """One transaction and the service's stores."""

    @property
    def tables(self) -> RatingTableStore: ...

    @property
    def policies(self) -> PolicyStore: ...

    @property
    def gateways(self) -> GatewayStore: ...

    @property
    def tunnels(self) -> TunnelStore: ...

    @property
    def tokens(self) -> TokenStore: ...

    @property
    def sessions(self) -> SessionStore: ...

    @property
    def audit(self) -> AuditStore: ...

    @property
    def events(self) -> EventStore: ...

    @property
    def idempotency(self) -> IdempotencyStore: ...

    @property
    def server_keys(self) -> ServerKeyStore: ...

    @property
    def shipped(self) -> ShippedLoadStore: ...

    @property
    def peers(self) -> PeerStore: ...

    def commit_with(self, work: Callable[[UnitOfWork], W]) -> W:
        """``work(unit)`` committed; its result. The commit may be shared with other writers'
        (SQLite: the writes waiting at once go in one transaction), so ``work`` may run more
        than once, on a unit other than this one: it must read and write only through the unit
        it is given and do nothing it could not repeat. A unit holding uncommitted changes
        runs ``work`` on itself and commits them with it.
        """
        ...

    def __enter__(self) -> UnitOfWork: ...


#: Opens a fresh unit of work (its own transaction).
UnitOfWorkFactory = Callable[[], UnitOfWork]


#: Seconds on a monotonic clock.
Clock = Callable[[], float]


class Metrics(Protocol):
    """Where the services count and time what they do (``app.adapters.metrics.PrometheusMetrics``
    has it; ``tests/fakes/metrics.py`` keeps what it is told).

    ``name`` is one of the metrics ``app.adapters.metrics.CATALOGUE`` declares, with exactly its
    labels; label values are few and fixed (an outcome, an error's class name, a gateway),
    never an id or free text.
    """

    def count(self, name: str, /, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to a counter."""
        ...

    def observe(self, name: str, value: float, /, **labels: str) -> None:
        """Record one value (seconds) in a histogram."""
        ...


class _NoMetrics:
    """Counts nothing: the default of a service not handed metrics (the command line, tests)."""

    def count(self, name: str, /, amount: float = 1.0, **labels: str) -> None:
        return None

    def observe(self, name: str, value: float, /, **labels: str) -> None:
        return None


#: Metrics that go nowhere.
NO_METRICS: Metrics = _NoMetrics()


def error_label(exc: BaseException) -> str:
    """An outcome label for a failure: a project error's class name (a fixed, small set), else ``error``."""
    from app.domain.errors import QossError

    return type(exc).__name__ if isinstance(exc, QossError) else "error"
