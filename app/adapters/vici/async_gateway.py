"""The VICI gateway for the event loop: each operation of the synchronous one in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from app.adapters.vici.gateway import ViciGateway
from app.adapters.vici.models import (
    Algorithms,
    IkeSa,
    Pool,
    Stats,
    VersionInfo,
)
from app.adapters.vici.session import Connect, unix_connect

__all__ = ["AsyncViciGateway"]


_T = TypeVar("_T")


class AsyncViciGateway:
    """The same operations as :class:`ViciGateway`, each run in a worker thread.

    Args:
        gateway: the synchronous gateway to run off the event loop.
    """

    def __init__(self, gateway: ViciGateway) -> None:
        self.sync = gateway

    @classmethod
    def for_socket(cls, socket_path: str, timeout: float = 10.0, connect: Connect = unix_connect) -> AsyncViciGateway:
        """An async gateway over a new :class:`ViciGateway`."""
        return cls(ViciGateway(socket_path, timeout, connect))

    @property
    def socket_path(self) -> str:
        """The VICI socket."""
        return self.sync.socket_path

    def __repr__(self) -> str:
        return f"AsyncViciGateway({self.sync!r})"

    async def version(self) -> VersionInfo:
        """See :meth:`ViciGateway.version`."""
        return await asyncio.to_thread(self.sync.version)

    async def stats(self) -> Stats:
        """See :meth:`ViciGateway.stats`."""
        return await asyncio.to_thread(self.sync.stats)

    async def get_algorithms(self) -> Algorithms:
        """See :meth:`ViciGateway.get_algorithms`."""
        return await asyncio.to_thread(self.sync.get_algorithms)

    async def list_sas(self, *, ike: str | None = None, ike_id: int | None = None) -> list[IkeSa]:
        """See :meth:`ViciGateway.list_sas`."""
        return await asyncio.to_thread(self.sync.list_sas, ike=ike, ike_id=ike_id)

    async def list_conns(self) -> list[str]:
        """See :meth:`ViciGateway.list_conns`."""
        return await asyncio.to_thread(self.sync.list_conns)

    async def get_shared(self) -> list[str]:
        """See :meth:`ViciGateway.get_shared`."""
        return await asyncio.to_thread(self.sync.get_shared)

    async def get_pools(self, leases: bool = True, name: str | None = None) -> list[Pool]:
        """See :meth:`ViciGateway.get_pools`."""
        return await asyncio.to_thread(self.sync.get_pools, leases, name)

    async def load_conn(self, name: str, conn: Mapping[str, Any]) -> None:
        """See :meth:`ViciGateway.load_conn`."""
        await asyncio.to_thread(self.sync.load_conn, name, conn)

    async def unload_conn(self, name: str) -> None:
        """See :meth:`ViciGateway.unload_conn`."""
        await asyncio.to_thread(self.sync.unload_conn, name)

    async def load_shared(self, id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> None:
        """See :meth:`ViciGateway.load_shared`."""
        await asyncio.to_thread(self.sync.load_shared, id, secret, owners, type)

    async def unload_shared(self, id: str) -> None:
        """See :meth:`ViciGateway.unload_shared`."""
        await asyncio.to_thread(self.sync.unload_shared, id)

    async def load_pool(self, name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> None:
        """See :meth:`ViciGateway.load_pool`."""
        await asyncio.to_thread(self.sync.load_pool, name, addrs, attributes)

    async def unload_pool(self, name: str) -> None:
        """See :meth:`ViciGateway.unload_pool`."""
        await asyncio.to_thread(self.sync.unload_pool, name)

    async def initiate(self, child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                       loglevel: int = 1) -> list[str]:
        """See :meth:`ViciGateway.initiate`."""
        return await asyncio.to_thread(self.sync.initiate, child, ike, timeout_ms, loglevel)

    async def terminate(self, *, ike: str | None = None, child: str | None = None, ike_id: int | None = None,
                        child_id: int | None = None, timeout_ms: int = 5_000, force: bool = False,
                        loglevel: int = 1) -> list[str]:
        """See :meth:`ViciGateway.terminate`."""
        return await asyncio.to_thread(
            lambda: self.sync.terminate(
                ike=ike, child=child, ike_id=ike_id, child_id=child_id,
                timeout_ms=timeout_ms, force=force, loglevel=loglevel,
            )
        )

