"""The tunnel agent's lab: Client, Host and Target in network namespaces, each role its own process.

Three lab hosts (:class:`app.lab.hosts.Lab`: ``client``, ``host`` and ``target``
behind a bridge, each with its own charon). Host and Target each run ``qoss serve`` with
their role's agent config and their own SQLite database, listening on their IKE address,
which only the namespaces reach; ``combined`` makes one server in Target's namespace play
both roles (the config's ``url: local``). A user joins from the client's namespace with
``qoss agent connect``; :func:`app.lab.agent_users.join` makes the user's key pair,
enrols the user at Host and writes the client's config on the way, then pings through the
tunnel. The servers' agent configs are made by :mod:`app.lab.agent_configs`.

``families`` is the lab's address families as for :class:`~app.lab.hosts.Lab`: ``(4,)`` (the
default), ``(6,)``, ``(4, 6)`` or ``(6, 4)``, the one IKE runs over first. The servers listen on
the IKE address of that family, so the agent's messages travel over it too; Target's IKE
address is of that family and it protects its inside networks of every family listed
(``10.3.0.1/32``, ``fd03::/64``). Its pool is :data:`POOL` with IPv4 only, :data:`POOL6` with
IPv6 only, and :data:`POOL` with :data:`POOL6` as its ``pool6`` with both (a dual pool: a client
gets an address of each family).

Everything lives under ``state_dir``::

    agent.json                 what is up: prefix, port, pool(s), families, the servers' pids, the users
    lab/                       the Lab: charons' configs, VICI sockets, logs, lab.json
    keys/                      every party's key pair (NAME.ed25519, NAME.x25519, NAME.pub.json)
    host.yaml, target.yaml     the servers' agent configs
    host.db, target.db         their databases (each server migrates its own at start)
    host.log, target.log       their output
    client-USER.yaml           a user's client config; client-USER/ its tunnel records

Every process the lab starts carries ``QOSS_LAB=<state_dir>`` in its environment, so
:meth:`AgentLab.down` finds it whatever the record says: it works from another process
and after a partial :meth:`AgentLab.up`, stops the servers and any client still running,
then the charons, deletes the namespaces and removes ``state_dir``. Needs root, as
:class:`~app.lab.hosts.Lab` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.adapters.agent.crypto import KeyPair, write_keys
from app.lab.agent_configs import host_role, server_config, target_role, write_config
from app.lab.hosts import Lab, LabHost, LabStatus
from app.lab.network import guard_inside
from app.lab.processes import (
    PRIVATE_UMASK,
    LabError,
    LabRecord,
    open_private_log,
    private_dir,
    private_umask,
    processes_with_env,
    running_with_env,
    stop_started,
)

__all__ = [
    "HOST_ID",
    "MARK",
    "POOL",
    "POOL6",
    "PORT",
    "TARGET_ID",
    "AgentLab",
    "AgentLabError",
    "AgentLabStatus",
]

#: Where the servers listen, on their IKE address inside their namespace.
PORT = 8400
#: The virtual IPs Target hands out (IPv4; and with IPv6 beside it, :data:`POOL6` as its ``pool6``).
POOL = "10.8.0.0/28"
#: The IPv6 virtual IPs Target hands out in a lab with IPv6 (alone, or beside :data:`POOL`).
POOL6 = "fd08::/124"
HOST_ID = "host-1"
TARGET_ID = "target-1"
#: Marks every process the lab starts (value: the state directory).
MARK = "QOSS_LAB"
_ROOT = Path(__file__).resolve().parents[2]  # where the ``app`` package this process runs was imported from
#: Waits inside the client's namespace until every URL answers 200 (standard library only: starts fast).
_PROBE = r"""
import sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline, pending = time.monotonic() + float(sys.argv[1]), set(sys.argv[2:])
while pending and time.monotonic() < deadline:
    for url in sorted(pending):
        try:
            with opener.open(url, timeout=1) as answer:
                if answer.status == 200:
                    pending.discard(url)
        except OSError:
            pass
    if pending:
        time.sleep(0.05)
sys.exit(1 if pending else 0)
"""


class AgentLabError(LabError):
    """The agent lab could not be built, or a user could not join (the message says why)."""



@dataclass(frozen=True, slots=True)
class AgentLabStatus:
    """What is there now: the lab's namespaces, charons and sockets, whether each server
    runs, and the users that joined."""

    lab: LabStatus
    servers: dict[str, bool]
    users: list[str]
    recorded: bool

    @property
    def healthy(self) -> bool:
        """Recorded, the lab healthy and every server running."""
        return self.recorded and self.lab.healthy and bool(self.servers) and all(self.servers.values())


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class AgentLab:
    """Client, Host and Target with their charons and servers, under ``state_dir``.

    Args:
        state_dir: where everything goes (not under /run; short: it holds UNIX sockets).
        prefix: namespace name prefix (``<prefix>-client``, ``-host``, ``-target``, ``-hub``).
        port: the servers' port.
        pool: the virtual IPs Target hands out (default: :data:`POOL`, or :data:`POOL6` in an IPv6-only lab).
        families: the address families, the one IKE runs over first (``(4,)``, ``(6,)``, ``(4, 6)``,
            ``(6, 4)``); with both, Target also hands out :data:`POOL6` beside ``pool``.
        combined: one server in Target's namespace plays Host and Target.
        server_env: extra environment for the servers (e.g. rate limits).
        client_env: extra environment for the client's ``qoss agent`` commands (e.g. ``QOSS_FAST_PATHS``).
        startup_timeout: seconds for the servers to answer ``/healthz``.

    A lab recorded in ``state_dir`` keeps the prefix, port, pools, families and layout it was built with.
    """

    def __init__(self, state_dir: Path, prefix: str = "qoss", *, port: int = PORT, pool: str | None = None,
                 families: Sequence[int] = (4,), combined: bool = False,
                 server_env: Mapping[str, str] | None = None, client_env: Mapping[str, str] | None = None,
                 startup_timeout: float = 60.0) -> None:
        self.state_dir = Path(state_dir).resolve()
        self._state = LabRecord(self.state_dir / "agent.json")
        recorded = self._state.load()
        self.prefix = str(recorded.get("prefix", prefix))
        self.port = int(recorded.get("port", port))
        self.families = tuple(int(f) for f in recorded.get("families", families))
        default_pool = POOL if 4 in self.families else POOL6
        self.pool = str(recorded.get("pool", pool or default_pool))
        pool6 = recorded.get("pool6", POOL6 if set(self.families) == {4, 6} else None)
        self.pool6: str | None = None if pool6 is None else str(pool6)
        self.combined = bool(recorded.get("combined", combined))
        self.server_env = dict(server_env or {})
        self.client_env = dict(client_env or {})
        self.startup_timeout = startup_timeout
        self.lab = Lab(self.state_dir / "lab", prefix=self.prefix, families=self.families)
        self._servers: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, prefix_hint: str = "qa", **kwargs: Any) -> Iterator[AgentLab]:
        """An agent lab under a unique prefix in a fresh directory of /tmp, up; always taken down."""
        state = Path(tempfile.mkdtemp(prefix="qoss-agent-", dir="/tmp"))  # short: UNIX socket paths
        lab = cls(state, prefix=f"{prefix_hint}{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}", **kwargs)
        try:
            lab.up()
            yield lab
        finally:
            try:
                lab.down()
            finally:
                shutil.rmtree(state, ignore_errors=True)

    # -- state ------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``state_dir/agent.json``."""
        return self._state.path

    @property
    def recorded(self) -> bool:
        """Whether a lab (or what is left of one) is recorded in ``state_dir``."""
        return self.state_file.exists() or self.lab.state_file.exists()

    # -- where things are ---------------------------------------------------------------

    @property
    def roles(self) -> tuple[str, ...]:
        """The server roles that run: ``("host", "target")``, or ``("target",)`` when combined."""
        return ("target",) if self.combined else ("host", "target")

    @property
    def host_server(self) -> str:
        """The role whose server plays Host (and holds the enrolled users)."""
        return "target" if self.combined else "host"

    def host(self, name: str) -> LabHost:
        """The lab host ``client``, ``host`` or ``target``."""
        return self.lab.host(name)

    @property
    def ipv6(self) -> bool:
        """Whether the lab has IPv6 (its hosts have IPv6 addresses)."""
        return 6 in self.families

    def url(self, role: str) -> str:
        """The URL of the server in ``role``'s namespace (on its IKE address of the lab's first family)."""
        address = self.host(role).gateway_ike_address
        return f"http://{f'[{address}]' if ':' in address else address}:{self.port}"

    def database_url(self, role: str) -> str:
        """The server's database."""
        return f"sqlite:///{self.state_dir / role}.db"

    def config_path(self, role: str) -> Path:
        """The server's agent config."""
        return self.state_dir / f"{role}.yaml"

    def client_config_path(self, user: str) -> Path:
        """The user's client config."""
        return self.state_dir / f"client-{user}.yaml"

    @property
    def key_dir(self) -> Path:
        """Every party's keys."""
        return self.state_dir / "keys"

    def record_user(self, user: str) -> None:
        """Record ``user`` among the lab's users (once)."""
        users = self._state.load().get("users", [])
        if user not in users:
            self._state.update(users=[*users, user])

    def server_pids(self) -> dict[str, int]:
        """Each running server's pid, by role."""
        return {role: int(s["pid"]) for role, s in self._state.load().get("servers", {}).items()}

    # -- processes ----------------------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment without its ``QOSS_`` settings, the lab's mark, and the ``app`` this process runs."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("QOSS_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env[MARK] = str(self.state_dir)
        return {**env, **(extra or {})}

    def _qoss(self, *args: str, netns: str | None = None) -> list[str]:
        cmd = [sys.executable, "-m", "app.cli", *args]
        return ["ip", "netns", "exec", netns, *cmd] if netns else cmd

    def qoss(self, *args: str, netns: str | None = None, check: bool = True,
             env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``qoss ARGS`` (this process's code), in a lab namespace if ``netns`` is given.

        Raises:
            AgentLabError: with ``check``, it exited non-zero (the message ends with its stderr).
        """
        done = subprocess.run(self._qoss(*args, netns=netns), capture_output=True, text=True, timeout=timeout,
                              check=False, env=self.env(env), cwd=self.state_dir, stdin=subprocess.DEVNULL,
                              umask=PRIVATE_UMASK)
        if check and done.returncode != 0:
            raise AgentLabError(f"qoss {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")
        return done

    def agent(self, user: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``qoss agent ARGS --config client-USER.yaml`` in the client's namespace, as the user would run it."""
        return self.qoss("agent", *args, "--config", str(self.client_config_path(user)),
                         netns=self.host("client").netns, check=check, env=self.client_env)

    # -- up -------------------------------------------------------------------------------

    def up(self) -> dict[str, Any]:
        """Build the lab and start the servers; on any failure take down what was built and raise.

        Returns:
            What :meth:`describe` returns, and the seconds it took.

        Raises:
            AgentLabError: a lab is recorded in ``state_dir`` already, or a step failed (the
                message has the servers' last log lines; the lab is down again).
        """
        if self.recorded:
            raise AgentLabError(f"an agent lab is recorded in {self.state_dir}: take it down first (qoss lab down)")
        started = time.monotonic()
        self._state.save({"prefix": self.prefix, "port": self.port, "pool": self.pool, "combined": self.combined,
                    **({"families": list(self.families)} if self.ipv6 else {}),
                    **({"pool6": self.pool6} if self.pool6 is not None else {}),
                    "servers": {}, "users": []})
        try:
            with private_umask():  # the key pairs and anything else written in this process
                self._build()
        except Exception as exc:
            logs = "".join(f"\n--- {role}.log ---\n{text}" for role in self.roles
                           if (text := _tail(self.state_dir / f"{role}.log")))
            self.down()
            raise AgentLabError(f"{exc}{logs}") from exc
        except BaseException:
            self.down()
            raise
        return {**self.describe(), "seconds": round(time.monotonic() - started, 2)}

    def _build(self) -> None:
        # "device": a bare namespace for stock VPN clients (charon-cmd), with no qoss and no charon.
        self.lab.up(names=["client", "host", "target", "device"], bare=["device"])
        guard_inside(self.host("target").netns, self.protected)  # its inside networks: for tunnels only
        ids = (TARGET_ID,) if self.combined else (HOST_ID, TARGET_ID)
        private_dir(self.key_dir)
        for name in ids:
            write_keys(KeyPair.generate(name), self.key_dir)
        target = self.host("target")
        host_id = ids[0]
        role = target_role(hosts={host_id: self.public_key_file(host_id)}, vici_socket=target.vici_socket,
                           ike_address=target.gateway_ike_address, protected=self.protected,
                           pool=self.pool, pool6=self.pool6, sweep_interval=0.5)
        if self.combined:
            write_config(self.config_path("target"), server_config(
                id=TARGET_ID, key_dir=self.key_dir,
                host=host_role({TARGET_ID: ("local", self.public_key_file(TARGET_ID))}), target=role))
        else:
            write_config(self.config_path("host"), server_config(
                id=HOST_ID, key_dir=self.key_dir,
                host=host_role({TARGET_ID: (self.url("target"), self.public_key_file(TARGET_ID))})))
            write_config(self.config_path("target"), server_config(id=TARGET_ID, key_dir=self.key_dir, target=role))
        for name in self.roles:
            self._serve(name)
        self._wait_ready()

    @property
    def protected(self) -> list[str]:
        """What Target protects: its inside networks of every family (``10.3.0.1/32``, ``fd03::/64``)."""
        return self.host("target").inside_networks

    def public_key_file(self, name: str) -> Path:
        """The public keys of party ``name`` (a server's id or a user)."""
        return self.key_dir / f"{name}.pub.json"

    def _serve(self, role: str) -> None:
        h = self.host(role)
        env = self.env({
            "QOSS_DATABASE_URL": self.database_url(role), "QOSS_AGENT_CONFIG": str(self.config_path(role)),
            "QOSS_RECONCILE_ON_START": "false", "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning",
            "QOSS_VICI_SOCKET_DIRS": json.dumps([str(self.state_dir)]), **self.server_env,
        })
        log_path = self.state_dir / f"{role}.log"
        with open_private_log(log_path) as log:  # the server keeps its own copy of the fd
            proc = subprocess.Popen(
                self._qoss("serve", "--host", h.gateway_ike_address, "--port", str(self.port), netns=h.netns),
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=self.state_dir, umask=PRIVATE_UMASK,
            )
        self._servers[role] = proc
        servers = self._state.load().get("servers", {})
        servers[role] = {"pid": proc.pid, "netns": h.netns, "url": self.url(role), "log": str(log_path),
                         "config": str(self.config_path(role)), "database_url": self.database_url(role)}
        self._state.update(servers=servers)

    def _wait_ready(self) -> None:
        urls = [f"{self.url(role)}/healthz" for role in self.roles]
        probe = subprocess.Popen(
            ["ip", "netns", "exec", self.host("client").netns, sys.executable, "-I", "-S", "-c", _PROBE,
             str(self.startup_timeout), *urls],
            env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            umask=PRIVATE_UMASK,
        )
        try:
            while probe.poll() is None:
                for role, server in self._servers.items():
                    if server.poll() is not None:
                        raise AgentLabError(f"the {role} server exited with {server.returncode}")
                time.sleep(0.05)
        finally:
            if probe.poll() is None:
                probe.kill()
            probe.wait()
        if probe.returncode != 0:
            raise AgentLabError(f"the servers did not answer {', '.join(urls)} within {self.startup_timeout:g} s")

    def describe(self) -> dict[str, Any]:
        """Where each part is: namespaces, addresses, URLs, pids, logs, configs, databases."""
        state = self._state.load()
        servers = state.get("servers", {})
        charons = self.lab.pids
        out: dict[str, Any] = {"prefix": self.prefix, "state_dir": str(self.state_dir), "pool": self.pool}
        if self.ipv6:
            out["families"] = list(self.families)
        if self.pool6 is not None:
            out["pool6"] = self.pool6
        for name in ("client", "host", "target"):
            try:
                h = self.host(name)
            except KeyError:
                continue
            part: dict[str, Any] = {"netns": h.netns, "ike_address": h.gateway_ike_address,
                                    "charon_pid": charons.get(name), "charon_log": h.log_path}
            part["vici_socket"] = h.vici_socket
            if name == "target":
                part["protected"] = h.inside_networks
            if name in servers:
                s = servers[name]
                part.update(url=s["url"], pid=s["pid"], log=s["log"], config=s["config"],
                            database_url=s["database_url"])
                if name == "target" and self.combined:
                    part["plays"] = ["host", "target"]
            out[name] = part
        with contextlib.suppress(KeyError):
            device = self.host("device")
            out["device"] = {"netns": device.netns, "ike_address": device.gateway_ike_address}
        out["users"] = list(state.get("users", []))
        return out

    # -- a phone ------------------------------------------------------------------------

    def phone_url(self) -> str:
        """Host as a phone's browser on this machine reaches it: ``http://127.0.0.1:<port>``, a
        relay (:mod:`app.lab.relay`) whose listening socket is in the root namespace and whose
        connections are made inside Host's namespace, to Host's address on the lab network. Started
        on first use; :meth:`down` stops it with everything else the lab started."""
        relay = self._state.load().get("phone_relay")
        if isinstance(relay, dict) and running_with_env(int(relay["pid"]), MARK, str(self.state_dir)):
            return f"http://127.0.0.1:{int(relay['port'])}"
        h = self.host(self.host_server)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)  # connections wait here until the relay takes them
            port = int(listener.getsockname()[1])
            address = h.gateway_ike_address
            cmd = ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.lab.relay", "--fd",
                   str(listener.fileno()), "--to", f"{f'[{address}]' if ':' in address else address}:{self.port}"]
            with open_private_log(self.state_dir / "phone-relay.log") as log:
                proc = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                        pass_fds=(listener.fileno(),), start_new_session=True,
                                        cwd=self.state_dir, umask=PRIVATE_UMASK)
        self._servers["phone-relay"] = proc
        self._state.update(phone_relay={"pid": proc.pid, "port": port})
        return f"http://127.0.0.1:{port}"

    def invite(self, user: str, *, platform: str, ttl: int = 900) -> dict[str, Any]:
        """A one-time invitation at the lab's Host for ``user``'s phone (as ``POST
        /v1/agent/invitations`` makes it), its link on :meth:`phone_url`.

        Returns:
            ``link`` (the secret in its fragment), ``id``, ``expires_at``, ``user_id``, ``platform``.

        Raises:
            AgentLabError: no lab is up. InvalidInput, AlreadyExists: as the API's.
        """
        from app.adapters.agent.crypto import CRYPTO
        from app.adapters.db.agent_store import SqlAgentStore
        from app.adapters.db.engine import make_session_factory
        from app.bootstrap import engine_for
        from app.services.agent.invitations import HostInvitations, join_link
        from app.settings import Settings

        if not self.state_file.exists():
            raise AgentLabError(f"no agent lab is up in {self.state_dir} (qoss lab up --agent)")
        engine = engine_for(Settings(database_url=self.database_url(self.host_server)))
        try:
            invitations = HostInvitations(host_id=TARGET_ID if self.combined else HOST_ID,
                                          store=SqlAgentStore(make_session_factory(engine)), crypto=CRYPTO)
            secret, listed = invitations.invite(user_id=user, platform=platform, ttl=ttl, created_by="lab")
        finally:
            engine.dispose()
        return {"link": join_link(self.phone_url(), secret), "id": listed["id"], "expires_at": listed["expires_at"],
                "user_id": user, "platform": platform}

    # -- status / down ------------------------------------------------------------------

    def status(self) -> AgentLabStatus:
        """The lab's namespaces, charons and sockets, whether each server runs, the users."""
        state = self._state.load()
        servers = {role: running_with_env(int(s["pid"]), "QOSS_AGENT_CONFIG", str(s["config"]))
                   for role, s in state.get("servers", {}).items()}
        return AgentLabStatus(lab=self.lab.status(), servers=servers, users=list(state.get("users", [])),
                              recorded=self.recorded)

    def down(self, grace: float = 10.0) -> None:
        """Stop the servers and any process the lab started, then the charons; delete the
        namespaces; remove ``state_dir``. Idempotent, safe after a partial :meth:`up` and from
        another process.

        Raises:
            LabError: a namespace could not be deleted (the state is kept, to try again).
        """
        victims = set(processes_with_env(MARK, self.state_dir, exact=True))
        for s in self._state.load().get("servers", {}).values():
            if running_with_env(int(s["pid"]), "QOSS_AGENT_CONFIG", str(s["config"])):
                victims.add(int(s["pid"]))
        stop_started(self._servers, victims, grace)
        self.lab.down()
        if self.state_file.exists() or (self.state_dir / "lab").exists():  # a directory this lab made
            shutil.rmtree(self.state_dir, ignore_errors=True)
