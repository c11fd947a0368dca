"""The strongSwan lab as code: charons in throwaway network namespaces.

Two hosts (``left``, ``right``) are joined by a veth pair created directly inside their
namespaces; more hosts hang off a bridge in a hub namespace ``<prefix>-hub``. Every host
gets an IKE address on ``10.99.0.0/24`` (``.1``, ``.2``, ...), an "inside" /32 on ``lo``
(``10.1.0.1``, ``10.2.0.1``, ...), and its own charon with kernel-libipsec, started in
its own mount namespace (private tmpfs on ``/run``) with its own ``strongswan.conf``
(``STRONGSWAN_CONF``), VICI socket and log file under ``state_dir/<host>/``. Charon
gives up on a silent peer after two quick retransmits, so failing tests fail fast.

Nothing in the root namespace is touched. The lab's state (namespaces, pids, sockets,
addresses) is written to ``state_dir/lab.json`` as it is built, so :meth:`Lab.down`
works from another process and after a partial :meth:`Lab.up`; it also stops any charon
whose ``strongswan.conf`` lies under ``state_dir`` that the record missed (a process killed
between starting a charon and writing its pid). Needs root, iproute2, util-linux
``unshare`` and strongSwan >= 5.9 (``kernel-libipsec``). The tunnel agent's lab (Client,
Host, Target and their servers) builds on it: :mod:`app.adapters.lab_agent`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.adapters.vici.driver import ViciGateway
from app.domain.errors import GatewayError

__all__ = ["CHARON", "IKE_INTERFACE", "Lab", "LabError", "LabHost", "LabStatus", "processes_with_env", "stop_processes"]

_log = logging.getLogger(__name__)

CHARON = "/usr/lib/ipsec/charon"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,14}$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,23}$")
#: Runs charon in a fresh mount namespace with a private /run. The script is constant:
#: the charon path arrives as ``$0``, the config through the environment.
_START_SCRIPT = 'mount -t tmpfs tmpfs /run && exec "$0"'
#: The interface IKE and ESP-in-UDP travel on between lab hosts (inside addresses live on ``lo``).
IKE_INTERFACE = "ike0"
_IKE_IF = IKE_INTERFACE
#: Characters allowed in the state directory: it is written into strongswan.conf.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./-]+$")
_MAX_SOCKET_PATH = 107


class LabError(RuntimeError):
    """The lab could not be built (the message says which step and why)."""


@dataclass(frozen=True, slots=True)
class LabHost:
    """One lab host: its namespace, charon's VICI socket, addresses and log."""

    name: str
    netns: str
    vici_socket: str
    ike_address: str
    inside_address: str
    log_path: str

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


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip() or proc.returncode}")
    return proc


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (zombies count as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def processes_with_env(variable: str, under: Path, *, exact: bool = False) -> list[int]:
    """The running processes whose environment sets ``variable`` to a path under ``under``
    (or, with ``exact``, to ``under`` itself): how a lab finds every process it started,
    whatever its record says. Reads ``/proc/<pid>/environ`` (root reads every process's).
    """
    base = str(Path(under))
    wanted = f"{variable}={base}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        matches = any(v == wanted or (not exact and v.startswith(wanted + b"/")) for v in environ)
        if matches and _running(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_processes(pids: Sequence[int], grace: float = 3.0, *, group: bool = False) -> None:
    """SIGTERM each process (its process group with ``group``), SIGKILL what still runs after ``grace`` s."""
    kill = os.killpg if group else os.kill
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.02)
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def _is_our_charon(pid: int, conf: str) -> bool:
    """Whether ``pid`` is still the charon we started (not a recycled pid)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return f"STRONGSWAN_CONF={conf}".encode() in environ


def _conf_text(host_dir: Path) -> str:
    return f"""# written by qoss lab
charon {{
  load_modular = yes
  # Every IKE_SA between two lab hosts comes from one address: charon's DoS protection would
  # drop the sixth set-up in flight from it (per-IP half-open limit) and, with the quick
  # retransmits below, concurrent set-ups would fail that a real deployment completes.
  dos_protection = no
  install_virtual_ip = yes
  retransmit_tries = 2
  retransmit_timeout = 1.0
  plugins {{
    include /etc/strongswan.d/charon/*.conf
    kernel-libipsec {{
      load = yes
      allow_peer_ts = yes
    }}
    vici {{
      socket = unix://{host_dir}/charon.vici
    }}
    stroke {{
      load = no
    }}
  }}
  filelog {{
    lab {{
      path = {host_dir}/charon.log
      time_format = %H:%M:%S
      flush_line = yes
      append = yes
      default = 1
      # cfg 2 would log every candidate config on each IKE_SA: O(conns) lines per set-up
      cfg = 1
      ike = 1
    }}
  }}
  syslog {{
    daemon {{
      default = -1
    }}
  }}
}}
"""


class Lab:
    """A set of charons in network namespaces named ``<prefix>-<host>``.

    Args:
        state_dir: where configs, sockets, logs and ``lab.json`` go (not under /run).
        prefix: namespace name prefix; distinct prefixes give independent labs.
        ike_network: the network the IKE addresses come from (host ``i`` gets ``.i+1``).
        charon: the charon binary.
        startup_timeout: seconds to wait for each charon's VICI socket to answer.
    """

    def __init__(
        self,
        state_dir: Path,
        prefix: str = "qoss",
        *,
        ike_network: str = "10.99.0.0/24",
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
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

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

    def up(self, n_hosts: int = 2, names: Sequence[str] | None = None) -> list[LabHost]:
        """Build the lab; on any failure tear down what was built and raise.

        Args:
            n_hosts: how many hosts, if ``names`` is not given (2: ``left``, ``right``;
                more: ``h1`` .. ``hN``).
            names: the host names (lower-case letters, digits, '-').

        Raises:
            LabError: a step failed (the lab is down again).
        """
        if names is None:
            names = ["left", "right"] if n_hosts == 2 else [f"h{i + 1}" for i in range(n_hosts)]
        names = list(names)
        if len(names) < 2 or len(set(names)) != len(names) or not all(_NAME.match(n) for n in names):
            raise ValueError("two or more distinct host names of lower-case letters, digits or '-'")
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
            self._build(names)
        except BaseException:
            self.down()
            raise
        _log.info("lab %s up in %.2f s", self.prefix, time.monotonic() - started)
        return self.hosts

    def _build(self, names: list[str]) -> None:
        state = _State(prefix=self.prefix)
        ike_hosts = list(self.ike_network.hosts())
        plen = self.ike_network.prefixlen
        hosts: list[LabHost] = []
        for i, name in enumerate(names):
            netns = f"{self.prefix}-{name}"
            if _netns_exists(netns):
                raise LabError(f"network namespace {netns} exists already")
            host_dir = self.state_dir / name
            host_dir.mkdir(parents=True, exist_ok=True)
            hosts.append(LabHost(
                name=name,
                netns=netns,
                vici_socket=str(host_dir / "charon.vici"),
                ike_address=str(ike_hosts[i]),
                inside_address=f"10.{i + 1}.0.1",
                log_path=str(host_dir / "charon.log"),
            ))
        hub = f"{self.prefix}-hub" if len(names) > 2 else None
        for netns in [h.netns for h in hosts] + ([hub] if hub else []):
            state.namespaces.append(netns)
            self._save(state)
            _run("ip", "netns", "add", netns)
            _run("ip", "-n", netns, "link", "set", "lo", "up")
        if hub is None:
            left, right = hosts
            _run("ip", "link", "add", _IKE_IF, "netns", left.netns, "type", "veth",
                 "peer", "name", _IKE_IF, "netns", right.netns)
        else:
            _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", hub, "link", "set", "br0", "up")
            for i, h in enumerate(hosts):
                port = f"p{i}"
                _run("ip", "link", "add", port, "netns", hub, "type", "veth",
                     "peer", "name", _IKE_IF, "netns", h.netns)
                _run("ip", "-n", hub, "link", "set", port, "master", "br0")
                _run("ip", "-n", hub, "link", "set", port, "up")
        for h in hosts:
            _run("ip", "-n", h.netns, "addr", "add", f"{h.ike_address}/{plen}", "dev", _IKE_IF)
            _run("ip", "-n", h.netns, "link", "set", _IKE_IF, "up")
            _run("ip", "-n", h.netns, "addr", "add", f"{h.inside_address}/32", "dev", "lo")
        state.hosts = [asdict(h) for h in hosts]
        self._save(state)
        for h in hosts:
            state.pids[h.name] = self._start_charon(h)
            self._save(state)
        for h in hosts:
            self._wait_ready(h)

    def _conf_path(self, host: LabHost) -> str:
        return str(Path(host.vici_socket).parent / "strongswan.conf")

    def _start_charon(self, host: LabHost) -> int:
        host_dir = Path(host.vici_socket).parent
        conf = self._conf_path(host)
        Path(conf).write_text(_conf_text(host_dir))
        with contextlib.suppress(FileNotFoundError):
            Path(host.vici_socket).unlink()
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "STRONGSWAN_CONF": conf}
        with open(host_dir / "charon.stderr", "ab") as err:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, "unshare", "-m", "--propagation", "private",
                 "sh", "-c", _START_SCRIPT, self.charon],
                env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True,
            )
        self._procs[host.name] = proc
        return proc.pid

    def _wait_ready(self, host: LabHost) -> None:
        deadline = time.monotonic() + self.startup_timeout
        gateway = ViciGateway(host.vici_socket, timeout=2.0)
        last = "not started"
        while time.monotonic() < deadline:
            proc = self._procs.get(host.name)
            if proc is not None and proc.poll() is not None:
                raise LabError(f"charon on {host.name} exited with {proc.returncode}; see {host.log_path}")
            try:
                gateway.version()
                return
            except GatewayError as exc:
                last = exc.message
            time.sleep(0.05)
        raise LabError(f"charon on {host.name} did not answer within {self.startup_timeout:g} s: {last}")

    # -- status / down ------------------------------------------------------------

    def status(self) -> LabStatus:
        """Namespaces present, charons alive, sockets there (from ``lab.json``)."""
        state = self._load()
        hosts = [LabHost(**h) for h in state.hosts]
        return LabStatus(
            namespaces={n: _netns_exists(n) for n in state.namespaces},
            charons={
                h.name: h.name in state.pids and _is_our_charon(state.pids[h.name], self._conf_path(h))
                for h in hosts
            },
            sockets={h.name: Path(h.vici_socket).exists() for h in hosts},
        )

    def stop_charon(self, name: str, grace: float = 3.0) -> None:
        """Stop one host's charon (SIGTERM, then SIGKILL), leaving the namespaces (for failure tests).

        Raises:
            KeyError: no such host in this lab.
        """
        host = self.host(name)
        pid = self._load().pids.get(name)
        if pid is None or not self._alive(name, pid) or not _is_our_charon(pid, self._conf_path(host)):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self._alive(name, pid):
            time.sleep(0.02)
        if self._alive(name, pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
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
        state = self._load()
        pid = state.pids.get(name)
        if pid is not None and self._alive(name, pid) and _is_our_charon(pid, self._conf_path(host)):
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
            if host is not None and _is_our_charon(pid, self._conf_path(host)):
                victims[name] = pid
        for proc_name, proc in self._procs.items():
            if proc.poll() is None:
                victims.setdefault(proc_name, proc.pid)
        for pid in processes_with_env("STRONGSWAN_CONF", self.state_dir):  # started, never recorded
            if pid not in victims.values():
                victims[f"pid {pid}"] = pid
        for pid in victims.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, pid in victims.items():
            while time.monotonic() < deadline and self._alive(name, pid):
                time.sleep(0.02)
            if self._alive(name, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for name, proc in list(self._procs.items()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
            del self._procs[name]
        errors = []
        for netns in reversed(state.namespaces):
            if _netns_exists(netns):
                done = _run("ip", "netns", "delete", netns, check=False)
                if done.returncode != 0 and _netns_exists(netns):
                    errors.append(f"{netns}: {done.stderr.strip()}")
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
        return _running(pid)
