"""An in-memory charon as the tunnel agent's roles see it (``app.domain.agent.ports.AgentVici``),
for tests of the roles that need no socket: what is loaded (conns, secrets, pools), every write
the roles made, and refusals scripted per command. For the wire protocol itself, the VICI
adapters are tested against :class:`tests.fakes.fake_charon.FakeCharon`."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.errors import GatewayRejected
from app.domain.ports import CharonCommand, Initiate, ListSas, LoadConn, LoadPool, LoadShared, Unload

__all__ = ["FakeAgentCharon", "FakeAgentVici"]

_ALGORITHMS: dict[str, dict[str, str]] = {
    "encryption": {"AES_CBC": "aesni", "NULL": "openssl"},
    "integrity": {"HMAC_SHA2_256_128": "openssl"},
    "aead": {"AES_GCM_16": "aesni", "CHACHA20_POLY1305": "openssl"},
    "prf": {"PRF_HMAC_SHA2_256": "openssl"},
    "dh": {"MODP_2048": "openssl", "CURVE_25519": "openssl"},
}


@dataclass(frozen=True)
class _Algorithms:
    sections: dict[str, dict[str, str]]

    def as_sections(self) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in self.sections.items()}


@dataclass(frozen=True)
class _Stats:
    backend: str


@dataclass
class FakeAgentCharon:
    """One charon's state; called with a socket path, it is the roles' ``vici`` factory."""

    backend: str = "kernel-netlink"
    algorithms: dict[str, dict[str, str]] = field(default_factory=lambda: {k: dict(v) for k, v in _ALGORITHMS.items()})
    conns: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: secret id -> its owners (the secret itself is not kept)
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)
    #: Command class name (``LoadPool``, ``Unload`` ...) -> charon's refusal of it.
    refuse: dict[str, str] = field(default_factory=dict)
    #: Every write of commands, as class names, in order (a batch or a pipeline's send).
    writes: list[list[str]] = field(default_factory=list)
    #: How often each read was asked (``get_algorithms``, ``stats``, ``list_conns`` ...).
    reads: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, socket_path: str) -> FakeAgentVici:
        return FakeAgentVici(self, socket_path)

    def run(self, command: CharonCommand) -> Any:
        """One command's reply, or charon's refusal as :class:`GatewayRejected`."""
        refusal = self.refuse.get(type(command).__name__)
        if refusal is not None:
            return GatewayRejected(f"{type(command).__name__} refused: {refusal}")
        with self.lock:
            if isinstance(command, LoadShared):
                self.shared[command.name] = command.owners
            elif isinstance(command, LoadConn):
                self.conns[command.name] = command.conn
            elif isinstance(command, LoadPool):
                self.pools[command.name] = command.addrs
            elif isinstance(command, Unload):
                gone = {"conn": self.conns, "shared": self.shared, "pool": self.pools}[command.what]
                if gone.pop(command.name, None) is None:
                    return GatewayRejected(f"unload-{command.what} {command.name}: not loaded")
            elif isinstance(command, ListSas):
                return []
            elif isinstance(command, Initiate):
                return GatewayRejected(f"initiate {command.child}: no peer in a fake")
        return {"success": "yes"}

    def write(self, commands: Sequence[CharonCommand]) -> None:
        with self.lock:
            self.writes.append([type(c).__name__ for c in commands])

    def read(self, what: str) -> None:
        with self.lock:
            self.reads[what] = self.reads.get(what, 0) + 1

    @property
    def empty(self) -> bool:
        """Nothing of the agent's is loaded."""
        return not (self.conns or self.shared or self.pools)


class _Pipeline:
    def __init__(self, charon: FakeAgentCharon) -> None:
        self._charon = charon
        self._replies: list[Any] = []

    def send(self, commands: Sequence[CharonCommand]) -> None:
        self._charon.write(commands)
        self._replies.extend(self._charon.run(c) for c in commands)

    def finish(self) -> list[Any]:
        return list(self._replies)

    def close(self) -> None:
        return None

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeAgentVici:
    """The roles' view of :class:`FakeAgentCharon` at ``socket_path``."""

    def __init__(self, charon: FakeAgentCharon, socket_path: str) -> None:
        self.charon = charon
        self.socket_path = socket_path

    def get_algorithms(self) -> _Algorithms:
        self.charon.read("get_algorithms")
        return _Algorithms(self.charon.algorithms)

    def stats(self) -> _Stats:
        self.charon.read("stats")
        return _Stats(self.charon.backend)

    def list_conns(self) -> list[str]:
        self.charon.read("list_conns")
        return sorted(self.charon.conns)

    def list_sas(self, *, ike: str | None = None) -> list[Any]:
        self.charon.read("list_sas")
        return []

    def terminate(self, *, ike: str | None = None, timeout_ms: int = 5_000, force: bool = False) -> Any:
        self.charon.read("terminate")
        return []

    def batch(self, commands: Sequence[CharonCommand]) -> list[Any]:
        with self.pipeline() as pipeline:
            pipeline.send(commands)
            return pipeline.finish()

    def pipeline(self) -> _Pipeline:
        return _Pipeline(self.charon)
