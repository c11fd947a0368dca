"""A real lab, a migrated SQLite database and the app, with a VICI spy that counts loads."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.adapters.vici.gateway import Pipeline, ViciGateway
from app.bootstrap import prepare_database
from app.domain.charon_port import LoadConn, LoadShared
from app.lab.hosts import Lab
from app.main import create_app
from app.settings import Settings
from tests.fixtures.secrets import register
from tests.integration.charon.conftest import temporary_lab


@dataclass
class Calls:
    """Every VICI command the service sent, by command name."""

    log: list[tuple[str, str]] = field(default_factory=list)
    #: the conn each ``list_sas`` asked for, in order
    listed: list[str | None] = field(default_factory=list)
    #: each ``list_sas``: the conn it asked for, the socket, the thread that sent it (its ident)
    listings: list[tuple[str | None, str, int]] = field(default_factory=list)
    secrets: list[bytes] = field(default_factory=list)
    after_load: Callable[[str], None] | None = None

    def count(self, command: str) -> int:
        return sum(1 for c, _ in self.log if c == command)


class SpyGateway(ViciGateway):
    """The real driver, recording each command (mock only what you own), also those sent on a
    pipeline: a set-up writes each end's secret and conn on one."""

    def __init__(self, path: str, calls: Calls) -> None:
        super().__init__(path, timeout=10.0)
        self._calls = calls

    def pipeline(self) -> Pipeline:
        return _SpyPipeline(self, self._calls)

    def load_conn(self, name: str, conn: Any) -> None:
        self._calls.log.append(("load_conn", self.socket_path))
        super().load_conn(name, conn)

    def load_shared(self, id: str, secret: bytes | str, owners: Any, type: str = "IKE") -> None:
        self._calls.log.append(("load_shared", self.socket_path))
        self._calls.secrets.append(secret if isinstance(secret, bytes) else secret.encode())
        register(secret)
        super().load_shared(id, secret, owners, type)
        if self._calls.after_load is not None:
            self._calls.after_load(self.socket_path)

    def list_sas(self, *, ike: str | None = None, ike_id: int | None = None) -> list[Any]:
        self._calls.log.append(("list_sas", self.socket_path))
        self._calls.listed.append(ike)
        self._calls.listings.append((ike, self.socket_path, threading.get_ident()))
        return super().list_sas(ike=ike, ike_id=ike_id)

    def initiate(self, child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                 loglevel: int = 1) -> list[str]:
        self._calls.log.append(("initiate", self.socket_path))
        return super().initiate(child=child, ike=ike, timeout_ms=timeout_ms, loglevel=loglevel)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with temporary_lab("qa") as lab:
        yield lab


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path, lab: Lab) -> Settings:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/qoss.db", vici_socket_dirs=[lab.state_dir],
                        reconcile_on_start=False)
    prepare_database(settings)
    return settings


@pytest.fixture
async def client(settings: Settings, calls: Calls, lab: Lab) -> AsyncIterator[httpx.AsyncClient]:
    from tests.api.conftest import make_token

    app = create_app(settings, vici_factory=lambda path: SpyGateway(path, calls))
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {make_token(settings.database_url, 'tunnel-tests', ['admin'])}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://qoss.test", timeout=30, headers=headers) as c,
    ):
            c.qoss_app = app  # type: ignore[attr-defined]  # for tests that wait on the app's background work
            for host in lab.hosts:
                r = await c.post("/v1/gateways", json={
                    "name": host.name, "vici_socket": host.vici_socket, "ike_address": host.ike_address,
                    "inside_networks": [f"{host.inside_address}/32"],
                })
                assert r.status_code == 201, r.text
            yield c
            # Whatever a test left, take it down so the next test starts clean.
            while left_over := (await c.get("/v1/tunnels?limit=1000")).json():
                for t in left_over:
                    await c.delete(f"/v1/tunnels/{t['id']}")


class _SpyPipeline(Pipeline):
    """A pipeline recording its loads as :class:`SpyGateway` records them (``after_load`` once
    their replies are read)."""

    def __init__(self, gateway: SpyGateway, calls: Calls) -> None:
        super().__init__(gateway)
        self._socket, self._spied, self._loaded_shared = gateway.socket_path, calls, False

    def send(self, commands: Sequence[Any]) -> None:
        for command in commands:
            if isinstance(command, LoadShared):
                self._spied.log.append(("load_shared", self._socket))
                self._spied.secrets.append(command.secret)
                register(command.secret)
                self._loaded_shared = True
            elif isinstance(command, LoadConn):
                self._spied.log.append(("load_conn", self._socket))
        super().send(commands)

    def finish(self) -> list[Any]:
        replies = super().finish()
        if self._loaded_shared and self._spied.after_load is not None:
            self._loaded_shared = False
            self._spied.after_load(self._socket)
        return replies
