"""The VICI driver's public names in one place (they live in the modules beside this one:
``session``, ``commands``, ``pipeline``, ``gateway``, ``async_gateway``)."""

from app.adapters.vici.async_gateway import AsyncViciGateway
from app.adapters.vici.commands import (
    Command,
    initiate_command,
    list_sas_command,
    load_conn_command,
    load_pool_command,
    load_shared_command,
    sas_of,
    unload_command,
)
from app.adapters.vici.gateway import Pipeline, ViciGateway
from app.adapters.vici.session import POOL, Connect, SessionPool, ViciSession, unix_connect

__all__ = [
    "POOL",
    "AsyncViciGateway",
    "Command",
    "Connect",
    "Pipeline",
    "SessionPool",
    "ViciGateway",
    "ViciSession",
    "initiate_command",
    "list_sas_command",
    "load_conn_command",
    "load_pool_command",
    "load_shared_command",
    "sas_of",
    "unix_connect",
    "unload_command",
]
