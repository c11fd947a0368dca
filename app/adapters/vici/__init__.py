"""strongSwan over VICI: the gateway driver, its typed replies, and the event listener."""

from app.adapters.vici.commands import Command
from app.adapters.vici.events import EventKind, EventListener, SaEvent
from app.adapters.vici.gateway import Pipeline, ViciGateway
from app.adapters.vici.models import Algorithms, ChildSa, IkeSa, Lease, Pool, Stats, VersionInfo
from app.adapters.vici.session import Connect, ViciSession, unix_connect

__all__ = [
    "Algorithms",
    "ChildSa",
    "Command",
    "Connect",
    "EventKind",
    "EventListener",
    "IkeSa",
    "Lease",
    "Pipeline",
    "Pool",
    "SaEvent",
    "Stats",
    "VersionInfo",
    "ViciGateway",
    "ViciSession",
    "unix_connect",
]
