"""The strongSwan lab as code: charons in throwaway network namespaces.

Two hosts (``left``, ``right``) are joined by a veth pair created directly inside their
namespaces; more hosts hang off a bridge in a hub namespace ``<prefix>-hub``
(:mod:`app.lab.network`). Every host gets an IKE address on ``10.99.0.0/24``
(``.1``, ``.2``, ...), an "inside" /32 on ``lo`` (``10.1.0.1``, ``10.2.0.1``, ...), and its
own charon with kernel-libipsec, started in its own mount namespace (private tmpfs on
``/run``) with its own ``strongswan.conf`` (``STRONGSWAN_CONF``), VICI socket and log file
under ``state_dir/<host>/`` (:mod:`app.lab.charon`). Charon gives up on a silent
peer after two quick retransmits, so failing tests fail fast.

With IPv6 (``families`` ``(6,)``, ``(4, 6)`` or ``(6, 4)``) every host also gets an IPv6 IKE
address on ``fd00:71::/64`` (``::1``, ``::2``, ...) and an inside address ``fd01::1``,
``fd02::1``, ... (its network ``fd01::/64``, ``fd02::/64``, ...), beside the IPv4 ones, which
are always there. The first family listed is the one IKE runs over: a host's
:attr:`LabHost.gateway_ike_address`, with which the lab's gateways are registered; its
:attr:`LabHost.inside_networks` are those of every family listed.

Nothing in the root namespace is touched. The lab's state (namespaces, pids, sockets,
addresses) is written to ``state_dir/lab.json`` as it is built, so :meth:`Lab.down`
works from another process and after a partial :meth:`Lab.up`; it also stops any charon
whose ``strongswan.conf`` lies under ``state_dir`` that the record missed (a process killed
between starting a charon and writing its pid). Needs root, iproute2, util-linux
``unshare`` and strongSwan >= 5.9 (``kernel-libipsec``). The tunnel agent's lab (Client,
Host, Target and their servers) builds on it: :mod:`app.lab.agent`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.adapters.vici.gateway import ViciGateway
from app.lab.charon import CHARON, start_charon, wait_for_charon
from app.lab.network import (
    add_addresses,
    add_addresses6,
    add_namespace,
    delete_namespace,
    join_by_bridge,
    join_pair,
    netns_exists,
)
from app.lab.processes import (
    LabError,
    private_dir,
    processes_with_env,
    running,
    running_with_env,
    stop_processes,
    write_private,
)

__all__ = ["Lab", "LabHost", "LabStatus"]

_log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,14}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,23}$")
#: Characters allowed in the state directory: it is written into strongswan.conf.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True, slots=True)
class LabHost:
    """One lab host: its namespace, charon's VICI socket, addresses and log."""

    name: str
    netns: str
    vici_socket: str
    ike_address: str
    inside_address: str
    log_path: str
    #: False: a bare namespace with no charon (where a stock VPN client runs).
    charon: bool = True
    #: IPv6 beside IPv4 (None: the lab has no IPv6): the IKE address and the inside address.
    ike_address6: str | None = None
    inside_address6: str | None = None
    #: The lab's address families, the one IKE runs over first: ``(4,)``, ``(6,)``, ``(4, 6)``, ``(6, 4)``.
    families: tuple[int, ...] = (4,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "families", tuple(int(f) for f in self.families))  # a list, read from lab.json

    @property
    def ike_family(self) -> int:
        """The address family IKE runs over (the first of :attr:`families`)."""
        return self.families[0]

    @property
    def gateway_ike_address(self) -> str:
        """The IKE address of :attr:`ike_family`: the one a lab gateway is registered with."""
        if self.ike_family == 6 and self.ike_address6 is not None:
            return self.ike_address6
        return self.ike_address

    @property
    def inside_network6(self) -> str | None:
        """The /64 of :attr:`inside_address6` (``fd01::/64``), None without IPv6."""
        if self.inside_address6 is None:
            return None
        return str(ipaddress.IPv6Interface(f"{self.inside_address6}/64").network)

    @property
    def inside_networks(self) -> list[str]:
        """The inside networks of every family, in :attr:`families` order (``10.1.0.1/32``, ``fd01::/64``)."""
        by_family = {4: f"{self.inside_address}/32", 6: self.inside_network6}
        return [net for family in self.families if (net := by_family.get(family)) is not None]

    def gateway(self, timeout: float = 10.0) -> ViciGateway:
        """A VICI gateway to this host's charon."""
        return ViciGateway(self.vici_socket, timeout)


@dataclass(frozen=True, slots=True)
class LabStatus:
    """What is there now: per namespace whether it exists, per host whether charon runs."""

    namespaces: dict[str, bool]
    charons: dict[str, bool]
    sockets: dict[str, bool]

    @property
    def healthy(self) -> bool:
        """Every namespace present, every charon alive, every socket there."""
        return bool(self.namespaces) and all(
            [*self.namespaces.values(), *self.charons.values(), *self.sockets.values()]
        )


@dataclass
class _State:
    prefix: str
    namespaces: list[str] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)


class Lab:
    """A set of charons in network namespaces named ``<prefix>-<host>``.

    Args:
        state_dir: where configs, sockets, logs and ``lab.json`` go (not under /run).
        prefix: namespace name prefix; distinct prefixes give independent labs.
        ike_network: the network the IKE addresses come from (host ``i`` gets ``.i+1``).
        families: the address families, the one IKE runs over first (``(4,)``, ``(6,)``,
            ``(4, 6)``, ``(6, 4)``); with 6 the hosts also get IPv6 addresses.
        ike_network6: the network the IPv6 IKE addresses come from (host ``i`` gets ``::i+1``).
        charon: the charon binary.
        startup_timeout: seconds to wait for each charon's VICI socket to answer.
    """

    def __init__(
        self,
        state_dir: Path,
        prefix: str = "qoss",
        *,
        ike_network: str = "10.99.0.0/24",
        families: Sequence[int] = (4,),
        ike_network6: str = "fd00:71::/64",
        charon: str = CHARON,
        startup_timeout: float = 20.0,
    ) -> None:
        if not _PREFIX.match(prefix):
            raise ValueError("a lab prefix is 1-24 letters, digits or '-'")
        self.state_dir = Path(state_dir).resolve()
        if self.state_dir == Path("/run") or Path("/run") in self.state_dir.parents:
            raise ValueError("the lab state must not live under /run (charon gets a private /run)")
        if not _SAFE_PATH.match(str(self.state_dir)):
            raise ValueError("the lab state directory may only contain letters, digits and _ . / -")
        self.prefix = prefix
        self.ike_network = ipaddress.IPv4Network(ike_network)
        self.families = tuple(families)
        if not self.families or len(set(self.families)) != len(self.families) or not set(self.families) <= {4, 6}:
            raise ValueError("the lab's address families are 4, 6, or both (the one IKE runs over first)")
        self.ike_network6 = ipaddress.IPv6Network(ike_network6)
        self.charon = charon
        self.startup_timeout = startup_timeout
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- state --------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``state_dir/lab.json``."""
        return self.state_dir / "lab.json"

    def _load(self) -> _State:
        try:
            raw = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return _State(prefix=self.prefix)
        return _State(
            prefix=str(raw.get("prefix", self.prefix)),
            namespaces=[str(n) for n in raw.get("namespaces", [])],
            hosts=list(raw.get("hosts", [])),
            pids={str(k): int(v) for k, v in raw.get("pids", {}).items()},
        )

    def _save(self, state: _State) -> None:
        private_dir(self.state_dir)
        write_private(self.state_file, json.dumps(asdict(state), indent=2))

    @property
    def hosts(self) -> list[LabHost]:
        """The hosts of the lab that is up (from ``lab.json``)."""
        return [LabHost(**h) for h in self._load().hosts]

    @property
    def pids(self) -> dict[str, int]:
        """Each host's charon pid as recorded (from ``lab.json``)."""
        return dict(self._load().pids)

    def host(self, name: str) -> LabHost:
        """The host called ``name``.

        Raises:
            KeyError: no such host in this lab.
        """
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    # -- up -----------------------------------------------------------------

    def up(self, n_hosts: int = 2, names: Sequence[str] | None = None, *, bare: Sequence[str] = ()) -> list[LabHost]:
        """Build the lab; on any failure tear down what was built and raise.

        Args:
            n_hosts: how many hosts, if ``names`` is not given (2: ``left``, ``right``;
                more: ``h1`` .. ``hN``).
            names: the host names (lower-case letters, digits, '-').
            bare: those of ``names`` that get no charon (a namespace on the lab's network only).

        Raises:
            LabError: a step failed (the lab is down again).
        """
        if names is None:
            names = ["left", "right"] if n_hosts == 2 else [f"h{i + 1}" for i in range(n_hosts)]
        names = list(names)
        if len(names) < 2 or len(set(names)) != len(names) or not all(_NAME.match(n) for n in names):
            raise ValueError("two or more distinct host names of lower-case letters, digits or '-'")
        if not set(bare) <= set(names):
            raise ValueError("bare hosts must be among the names")
        if len(names) > min(200, self.ike_network.num_addresses - 2):
            raise ValueError("too many hosts for the IKE network")
        if len(names) > 2 and "hub" in names:
            raise ValueError("'hub' is the name of the bridge namespace")
        longest = max(len(str(self.state_dir / n / "charon.vici")) for n in names)
        if longest > _MAX_SOCKET_PATH:
            raise ValueError(f"socket paths under {self.state_dir} would be too long for UNIX sockets")
        if self._load().namespaces:
            raise LabError(f"a lab is already recorded in {self.state_file}; call down() first")
        started = time.monotonic()
        try:
            self._build(names, frozenset(bare))
        except BaseException:
            self.down()
            raise
        _log.info("lab %s up in %.2f s", self.prefix, time.monotonic() - started)
        return self.hosts


    def _build(self, names: list[str], bare: frozenset[str] = frozenset()) -> None:
        state = _State(prefix=self.prefix)
        ike_hosts = list(self.ike_network.hosts())
        plen = self.ike_network.prefixlen
        ipv6 = 6 in self.families
        hosts: list[LabHost] = []
        for i, name in enumerate(names):
            netns = f"{self.prefix}-{name}"
            if netns_exists(netns):
                raise LabError(f"network namespace {netns} exists already")
            host_dir = self.state_dir / name
            private_dir(host_dir)
            hosts.append(LabHost(
                name=name,
                netns=netns,
                vici_socket=str(host_dir / "charon.vici"),
                ike_address=str(ike_hosts[i]),
                inside_address=f"10.{i + 1}.0.1",
                log_path=str(host_dir / "charon.log"),
                charon=name not in bare,
                ike_address6=str(self.ike_network6[i + 1]) if ipv6 else None,
                inside_address6=f"fd{i + 1:02x}::1" if ipv6 else None,
                families=self.families,
            ))
        hub = f"{self.prefix}-hub" if len(names) > 2 else None
        for netns in [h.netns for h in hosts] + ([hub] if hub else []):
            state.namespaces.append(netns)
            self._save(state)
            add_namespace(netns)
        if hub is None:
            left, right = hosts
            join_pair(left.netns, right.netns)
        else:
            join_by_bridge(hub, [h.netns for h in hosts])
        for h in hosts:
            add_addresses(h.netns, f"{h.ike_address}/{plen}", h.inside_address)
            if h.ike_address6 is not None and h.inside_address6 is not None:
                add_addresses6(h.netns, f"{h.ike_address6}/{self.ike_network6.prefixlen}", h.inside_address6)
        state.hosts = [asdict(h) for h in hosts]
        self._save(state)
        for h in hosts:
            if h.charon:
                state.pids[h.name] = self._start_charon(h)
                self._save(state)
        for h in hosts:
            if h.charon:
                self._wait_ready(h)

    def _conf_path(self, host: LabHost) -> str:
        return str(Path(host.vici_socket).parent / "strongswan.conf")

    def _is_our_charon(self, pid: int, host: LabHost) -> bool:
        """Whether ``pid`` is still the charon started for ``host`` (not a recycled pid)."""
        return running_with_env(pid, "STRONGSWAN_CONF", self._conf_path(host))

    def _start_charon(self, host: LabHost) -> int:
        proc = start_charon(netns=host.netns, host_dir=Path(host.vici_socket).parent, conf=self._conf_path(host),
                            charon=self.charon)
        self._procs[host.name] = proc
        return proc.pid

    def _wait_ready(self, host: LabHost) -> None:
        wait_for_charon(name=host.name, vici_socket=host.vici_socket, log_path=host.log_path,
                        proc=self._procs.get(host.name), timeout=self.startup_timeout)

    # -- status / down ------------------------------------------------------------

    def status(self) -> LabStatus:
        """Namespaces present, charons alive, sockets there (from ``lab.json``)."""
        state = self._load()
        hosts = [LabHost(**h) for h in state.hosts]
        return LabStatus(
            namespaces={n: netns_exists(n) for n in state.namespaces},
            charons={h.name: h.name in state.pids and self._is_our_charon(state.pids[h.name], h)
                     for h in hosts if h.charon},
            sockets={h.name: Path(h.vici_socket).exists() for h in hosts if h.charon},
        )

    def stop_charon(self, name: str, grace: float = 3.0) -> None:
        """Stop one host's charon (SIGTERM, then SIGKILL), leaving the namespaces (for failure tests).

        Raises:
            KeyError: no such host in this lab.
        """
        host = self.host(name)
        pid = self._load().pids.get(name)
        if pid is None or not self._alive(name, pid) or not self._is_our_charon(pid, host):
            return
        stop_processes([pid], grace)
        proc = self._procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)

    def start_charon(self, name: str) -> None:
        """(Re)start one host's charon, e.g. after :meth:`stop_charon` (restart tests), and wait for it.

        Raises:
            KeyError: no such host in this lab.
            LabError: charon did not come up.
        """
        host = self.host(name)
        if not host.charon:
            raise LabError(f"{name} is a bare namespace: it has no charon")
        state = self._load()
        pid = state.pids.get(name)
        if pid is not None and self._alive(name, pid) and self._is_our_charon(pid, host):
            return
        state.pids[name] = self._start_charon(host)
        self._save(state)
        self._wait_ready(host)

    def down(self, grace: float = 3.0) -> None:
        """Stop the charons (SIGTERM, then SIGKILL after ``grace`` s) and delete the namespaces.

        Idempotent, safe after a partial :meth:`up` and from another process.
        """
        state = self._load()
        hosts = {h["name"]: LabHost(**h) for h in state.hosts}
        victims: dict[str, int] = {}
        for name, pid in state.pids.items():
            host = hosts.get(name)
            if host is not None and self._is_our_charon(pid, host):
                victims[name] = pid
        for proc_name, proc in self._procs.items():
            if proc.poll() is None:
                victims.setdefault(proc_name, proc.pid)
        for pid in processes_with_env("STRONGSWAN_CONF", self.state_dir):  # started, never recorded
            if pid not in victims.values():
                victims[f"pid {pid}"] = pid
        stop_processes(list(victims.values()), grace)
        for name, proc in list(self._procs.items()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
            del self._procs[name]
        errors = [error for netns in reversed(state.namespaces) if (error := delete_namespace(netns))]
        for host in hosts.values():
            with contextlib.suppress(FileNotFoundError):
                Path(host.vici_socket).unlink()
        if errors:
            raise LabError("could not delete " + "; ".join(errors))
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    def _alive(self, name: str, pid: int) -> bool:
        proc = self._procs.get(name)
        if proc is not None and proc.pid == pid:
            return proc.poll() is None
        return running(pid)
