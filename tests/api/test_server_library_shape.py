"""What app/web/server.py's ``_Server`` relies on in uvicorn beyond its public ``Server.run``:
the ``startup``/``shutdown``/``handle_exit`` hooks it overrides, the state it reads
(``started``, ``server_state.connections``, ``lifespan.state``) and how uvicorn makes a
connection's protocol (``config.http_protocol_class(config=, server_state=, app_state=)``),
checked against the pinned version: an upgrade that changes any of it fails here, naming
uvicorn. ``QOSS_MAX_CONNECTIONS=0`` leaves accepting to uvicorn itself (only the draining hook
and the deadlines' protocol stay, the latter pinned in test_slow_clients)."""

from __future__ import annotations

import asyncio
import inspect

import uvicorn
from fastapi import FastAPI
from uvicorn.server import ServerState

from tests.fixtures.library_pins import assert_pinned

UVICORN = assert_pinned("uvicorn", "app/web/server.py _Server")


def _shape(ok: bool, what: str) -> None:
    assert ok, (f"uvicorn {UVICORN}: {what} changed; app/web/server.py's _Server relies on it "
                "(QOSS_MAX_CONNECTIONS=0 avoids the accepting part)")


def _params(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_hooks_the_server_overrides_keep_their_signatures() -> None:
    _shape(_params(uvicorn.Server.startup) == ["self", "sockets"], "Server.startup(sockets)")
    _shape(_params(uvicorn.Server.shutdown) == ["self", "sockets"], "Server.shutdown(sockets)")
    _shape(_params(uvicorn.Server.handle_exit) == ["self", "sig", "frame"], "Server.handle_exit(sig, frame)")
    _shape(inspect.iscoroutinefunction(uvicorn.Server.startup), "Server.startup is a coroutine")
    _shape(inspect.iscoroutinefunction(uvicorn.Server.shutdown), "Server.shutdown is a coroutine")


def test_the_state_the_server_reads_is_there() -> None:
    server = uvicorn.Server(uvicorn.Config(FastAPI(), http="httptools", lifespan="off"))
    _shape(server.started is False, "Server.started")
    _shape(isinstance(server.server_state, ServerState), "Server.server_state")
    _shape(isinstance(server.server_state.connections, set), "ServerState.connections")
    source = inspect.getsource(uvicorn.Server)
    _shape("self.lifespan = config.lifespan_class(config)" in source, "the server's lifespan")
    _shape("app_state=self.lifespan.state" in inspect.getsource(uvicorn.Server.startup),
           "a connection's protocol gets the lifespan's state")
    from uvicorn.lifespan.on import LifespanOn

    _shape(LifespanOn(uvicorn.Config(FastAPI())).state == {}, "LifespanOn.state")


def test_a_connections_protocol_is_made_from_the_config_as_the_server_makes_it() -> None:
    config = uvicorn.Config(FastAPI(), http="httptools", lifespan="off")
    config.load()
    protocol_class = config.http_protocol_class
    _shape({"config", "server_state", "app_state"} <= set(_params(protocol_class.__init__)),
           "http_protocol_class(config=, server_state=, app_state=)")
    async def made() -> object:  # a protocol is made on the running loop, as uvicorn makes it
        return protocol_class(config=config, server_state=ServerState(), app_state={})

    protocol = asyncio.run(made())
    for hook in ("connection_made", "connection_lost", "data_received"):
        _shape(callable(getattr(protocol, hook, None)), f"the protocol's {hook}")
