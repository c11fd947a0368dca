"""A charon as the tunnel agent's roles use it (:class:`app.domain.agent.ports.AgentVici`): a
:class:`~app.adapters.vici.gateway.ViciGateway` whose batches and pipelines take the agent's
command values, each turned into its VICI :class:`~app.adapters.vici.commands.Command`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.adapters.vici import commands as vc
from app.adapters.vici.gateway import Pipeline, ViciGateway
from app.adapters.vici.models import IkeSa
from app.domain.agent import ports as ap
from app.domain.errors import GatewayError

__all__ = ["AgentPipeline", "AgentVici", "agent_vici"]


def _command(c: ap.CharonCommand) -> vc.Command:
    if isinstance(c, ap.LoadShared):
        return vc.load_shared_command(c.name, c.secret, c.owners)
    if isinstance(c, ap.LoadConn):
        return vc.load_conn_command(c.name, c.conn)
    if isinstance(c, ap.LoadPool):
        return vc.load_pool_command(c.name, c.addrs)
    if isinstance(c, ap.Initiate):
        return vc.initiate_command(child=c.child, ike=c.ike, timeout_ms=c.timeout_ms)
    if isinstance(c, ap.ListSas):
        return vc.list_sas_command(ike=c.ike)
    return vc.unload_command(c.what, c.name)


def _replies(commands: Sequence[ap.CharonCommand], replies: list[Any]) -> list[Any]:
    """The replies, a ``list-sas`` one as its IKE_SAs."""
    return [vc.sas_of(r["events"]) if isinstance(c, ap.ListSas) and not isinstance(r, GatewayError) else r
            for c, r in zip(commands, replies, strict=True)]


class AgentPipeline:
    """A :class:`~app.adapters.vici.gateway.Pipeline` of the agent's commands."""

    __slots__ = ("_pipeline", "_sent")

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self._sent: list[ap.CharonCommand] = []

    def send(self, commands: Sequence[ap.CharonCommand]) -> None:
        self._sent.extend(commands)
        self._pipeline.send([_command(c) for c in commands])

    def finish(self) -> list[Any]:
        replies = self._pipeline.finish()
        return _replies(self._sent[:len(replies)], replies)

    def close(self) -> None:
        self._pipeline.close()

    def __enter__(self) -> AgentPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AgentVici:
    """The agent's commands on ``gateway``'s charon."""

    __slots__ = ("gateway", "socket_path")

    def __init__(self, gateway: ViciGateway) -> None:
        self.gateway = gateway
        self.socket_path = gateway.socket_path

    def get_algorithms(self) -> Any:
        return self.gateway.get_algorithms()

    def stats(self) -> Any:
        return self.gateway.stats()

    def list_conns(self) -> list[str]:
        return self.gateway.list_conns()

    def list_sas(self, *, ike: str | None = None) -> list[IkeSa]:
        return self.gateway.list_sas(ike=ike)

    def terminate(self, *, ike: str | None = None, timeout_ms: int = 5_000, force: bool = False) -> Any:
        return self.gateway.terminate(ike=ike, timeout_ms=timeout_ms, force=force)

    def batch(self, commands: Sequence[ap.CharonCommand]) -> list[Any]:
        return _replies(commands, self.gateway.batch([_command(c) for c in commands]))

    def pipeline(self) -> AgentPipeline:
        return AgentPipeline(self.gateway.pipeline())


def agent_vici(gateways: Callable[[str], Any]) -> Callable[[str], AgentVici]:
    """The agent's charons from a factory of :class:`ViciGateway` s (socket path -> gateway)."""
    return lambda path: AgentVici(gateways(path))
