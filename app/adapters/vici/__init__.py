"""strongSwan over VICI: the gateway driver, its typed replies, and the event listener."""

from app.adapters.vici.driver import AsyncViciGateway, Connect, ViciGateway, ViciSession, unix_connect
from app.adapters.vici.events import EventKind, EventListener, SaEvent
from app.adapters.vici.models import Algorithms, ChildSa, IkeSa, Lease, Pool, Stats, VersionInfo

__all__ = [
    "Algorithms",
    "AsyncViciGateway",
    "ChildSa",
    "Connect",
    "EventKind",
    "EventListener",
    "IkeSa",
    "Lease",
    "Pool",
    "SaEvent",
    "Stats",
    "VersionInfo",
    "ViciGateway",
    "ViciSession",
    "unix_connect",
]
