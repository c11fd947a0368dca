"""Repositories: domain objects in and out of the database, one module per kind of thing.
Each satisfies a store protocol of ``app.domain.ports``; they flush, never commit."""

from app.adapters.db.repositories.access import AuditRepository, SessionRepository, TokenRepository
from app.adapters.db.repositories.events import EventRepository
from app.adapters.db.repositories.keys import IdempotencyRepository, ServerKeyRepository, ShippedLoadRepository
from app.adapters.db.repositories.network import GatewayRepository, TunnelRepository
from app.adapters.db.repositories.peers import PeerRepository
from app.adapters.db.repositories.revisioned import PolicyRepository, RatingTableRepository

__all__ = [
    "AuditRepository",
    "EventRepository",
    "GatewayRepository",
    "IdempotencyRepository",
    "PeerRepository",
    "PolicyRepository",
    "RatingTableRepository",
    "ServerKeyRepository",
    "SessionRepository",
    "ShippedLoadRepository",
    "TokenRepository",
    "TunnelRepository",
]
