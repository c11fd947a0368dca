"""The tunnel agent's lab: Client, Host and Target in network namespaces, each role its own process.

Three lab hosts (:class:`app.adapters.lab.Lab`: ``client``, ``host`` and ``target``
behind a bridge, each with its own charon). Host and Target each run ``qoss serve`` with
their role's agent config and their own SQLite database, listening on their IKE address,
which only the namespaces reach; ``combined`` makes one server in Target's namespace play
both roles (the config's ``url: local``). A user joins from the client's namespace with
``qoss agent connect``; :meth:`AgentLab.join` makes the user's key pair, enrols the user
at Host and writes the client's config on the way, then pings through the tunnel.

Everything lives under ``state_dir``::

    agent.json                 what is up: prefix, port, pool, the servers' pids, the users
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
:class:`~app.adapters.lab.Lab` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.adapters.agent.crypto import KeyPair, load_public, write_keys
from app.adapters.lab import Lab, LabError, LabHost, LabStatus, processes_with_env, stop_processes
from app.adapters.vici import IkeSa
from app.domain.errors import AlreadyExists, GatewayError
from app.services.agent_config import load_client_config, load_server_config

__all__ = [
    "ALL_OBJECTIVES",
    "HOST_ID",
    "POOL",
    "PORT",
    "TARGET_ID",
    "AgentLab",
    "AgentLabError",
    "AgentLabStatus",
    "charon_suite",
    "client_config",
    "host_role",
    "server_config",
    "target_role",
    "write_config",
]

#: Where the servers listen, on their IKE address inside their namespace.
PORT = 8400
#: The virtual IPs Target hands out.
POOL = "10.8.0.0/28"
HOST_ID = "host-1"
TARGET_ID = "target-1"
#: What a lab user is enrolled for: every Objective-ID (Target refuses what it cannot give).
ALL_OBJECTIVES = (1, 2, 3, 4)
#: Marks every process the lab starts (value: the state directory).
MARK = "QOSS_LAB"
_USER = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
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


# -- the role configs -----------------------------------------------------------------


def host_role(targets: Mapping[str, tuple[str, Path]]) -> dict[str, Any]:
    """The Host role: the targets it trusts, by id, as (URL or ``"local"``, public key file)."""
    return {"targets": {name: {"url": url, "public_key_file": str(pub)} for name, (url, pub) in targets.items()}}


def target_role(*, hosts: Mapping[str, Path], vici_socket: str, ike_address: str, protected: Sequence[str],
                pool: str, sweep_interval: float = 1.0) -> dict[str, Any]:
    """The Target role: the hosts it trusts (id -> public key file), its charon, what it protects, its pool."""
    return {"hosts": {name: {"public_key_file": str(pub)} for name, pub in hosts.items()},
            "vici_socket": vici_socket, "ike_address": ike_address, "protected": list(protected), "pool": pool,
            "sweep_interval": sweep_interval}


def server_config(*, id: str, key_dir: Path, host: Mapping[str, Any] | None = None,
                  target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A server's agent config (``QOSS_AGENT_CONFIG``) playing Host, Target or both."""
    config: dict[str, Any] = {"id": id, "key_dir": str(key_dir)}
    if host is not None:
        config["host"] = dict(host)
    if target is not None:
        config["target"] = dict(target)
    return config


def client_config(*, user: str, key_dir: Path, host_id: str, host_url: str, host_key: Path,
                  targets: Mapping[str, Path], vici_socket: str, state_dir: Path,
                  ike_address: str | None = None) -> dict[str, Any]:
    """A client's agent config (``qoss agent ... --config``)."""
    config: dict[str, Any] = {
        "user": user, "key_dir": str(key_dir),
        "host": {"id": host_id, "url": host_url, "public_key_file": str(host_key)},
        "targets": {name: {"public_key_file": str(pub)} for name, pub in targets.items()},
        "vici_socket": vici_socket, "state_dir": str(state_dir),
    }
    if ike_address is not None:
        config["ike_address"] = ike_address
    return config


def write_config(path: Path, config: Mapping[str, Any], *, client: bool = False) -> Path:
    """Write an agent config as YAML and read it back with the loader qoss uses (which checks it).

    Raises:
        InvalidInput: the config is not valid.
    """
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    if client:
        load_client_config(path)
    else:
        load_server_config(path)
    return path


def charon_suite(sa: IkeSa) -> dict[str, str]:
    """The suite of an IKE_SA and its first CHILD_SA as charon reports it, written as
    ``swanctl --list-sas`` does (``AES_CBC-128/HMAC_SHA2_256_128/PRF_HMAC_SHA2_256/CURVE_25519``,
    ``ESP:AES_GCM_16-128``)."""

    def alg(name: str | None, keysize: int | None) -> str | None:
        return None if name is None else f"{name}-{keysize}" if keysize else name

    ike = "/".join(p for p in (alg(sa.encr_alg, sa.encr_keysize), sa.integ_alg, sa.prf_alg, sa.dh_group) if p)
    out = {"ike": ike}
    if sa.children:
        child = sa.children[0]
        parts = (alg(child.encr_alg, child.encr_keysize), child.integ_alg, child.dh_group)
        out["child"] = f"{child.protocol}:" + "/".join(p for p in parts if p)
    return out


# -- the lab ----------------------------------------------------------------------------


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


def _running_as(pid: int, variable: str, value: str) -> bool:
    """Whether ``pid`` runs with ``variable=value`` in its environment (not a recycled pid)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and f"{variable}={value}".encode() in environ


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
        pool: the virtual IPs Target hands out.
        combined: one server in Target's namespace plays Host and Target.
        server_env: extra environment for the servers (e.g. rate limits).
        client_env: extra environment for the client's ``qoss agent`` commands (e.g. ``QOSS_FAST_PATHS``).
        startup_timeout: seconds for the servers to answer ``/healthz``.

    A lab recorded in ``state_dir`` keeps the prefix, port, pool and layout it was built with.
    """

    def __init__(self, state_dir: Path, prefix: str = "qoss", *, port: int = PORT, pool: str = POOL,
                 combined: bool = False, server_env: Mapping[str, str] | None = None,
                 client_env: Mapping[str, str] | None = None, startup_timeout: float = 60.0) -> None:
        self.state_dir = Path(state_dir).resolve()
        recorded = self._load()
        self.prefix = str(recorded.get("prefix", prefix))
        self.port = int(recorded.get("port", port))
        self.pool = str(recorded.get("pool", pool))
        self.combined = bool(recorded.get("combined", combined))
        self.server_env = dict(server_env or {})
        self.client_env = dict(client_env or {})
        self.startup_timeout = startup_timeout
        self.lab = Lab(self.state_dir / "lab", prefix=self.prefix)
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
        return self.state_dir / "agent.json"

    @property
    def recorded(self) -> bool:
        """Whether a lab (or what is left of one) is recorded in ``state_dir``."""
        return self.state_file.exists() or self.lab.state_file.exists()

    def _load(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return raw if isinstance(raw, dict) else {}

    def _save(self, state: Mapping[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    def _update(self, **changes: Any) -> None:
        self._save({**self._load(), **changes})

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

    def url(self, role: str) -> str:
        """The URL of the server in ``role``'s namespace."""
        return f"http://{self.host(role).ike_address}:{self.port}"

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

    def server_pids(self) -> dict[str, int]:
        """Each running server's pid, by role."""
        return {role: int(s["pid"]) for role, s in self._load().get("servers", {}).items()}

    # -- processes ----------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
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
                              check=False, env=self._env(env), cwd=self.state_dir, stdin=subprocess.DEVNULL)
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
        self._save({"prefix": self.prefix, "port": self.port, "pool": self.pool, "combined": self.combined,
                    "servers": {}, "users": []})
        try:
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
        self.lab.up(names=["client", "host", "target"])
        ids = (TARGET_ID,) if self.combined else (HOST_ID, TARGET_ID)
        for name in ids:
            write_keys(KeyPair.generate(name), self.key_dir)
        target = self.host("target")
        host_id = ids[0]
        role = target_role(hosts={host_id: self._pub(host_id)}, vici_socket=target.vici_socket,
                           ike_address=target.ike_address, protected=[f"{target.inside_address}/32"],
                           pool=self.pool, sweep_interval=0.5)
        if self.combined:
            write_config(self.config_path("target"), server_config(
                id=TARGET_ID, key_dir=self.key_dir, host=host_role({TARGET_ID: ("local", self._pub(TARGET_ID))}),
                target=role))
        else:
            write_config(self.config_path("host"), server_config(
                id=HOST_ID, key_dir=self.key_dir, host=host_role({TARGET_ID: (self.url("target"),
                                                                             self._pub(TARGET_ID))})))
            write_config(self.config_path("target"), server_config(id=TARGET_ID, key_dir=self.key_dir, target=role))
        for name in self.roles:
            self._serve(name)
        self._wait_ready()

    def _pub(self, name: str) -> Path:
        return self.key_dir / f"{name}.pub.json"

    def _serve(self, role: str) -> None:
        h = self.host(role)
        env = self._env({
            "QOSS_DATABASE_URL": self.database_url(role), "QOSS_AGENT_CONFIG": str(self.config_path(role)),
            "QOSS_RECONCILE_ON_START": "false", "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "warning",
            "QOSS_VICI_SOCKET_DIRS": json.dumps([str(self.state_dir)]), **self.server_env,
        })
        log_path = self.state_dir / f"{role}.log"
        with open(log_path, "ab") as log:  # the server keeps its own copy of the fd
            proc = subprocess.Popen(
                self._qoss("serve", "--host", h.ike_address, "--port", str(self.port), netns=h.netns),
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=self.state_dir,
            )
        self._servers[role] = proc
        servers = self._load().get("servers", {})
        servers[role] = {"pid": proc.pid, "netns": h.netns, "url": self.url(role), "log": str(log_path),
                         "config": str(self.config_path(role)), "database_url": self.database_url(role)}
        self._update(servers=servers)

    def _wait_ready(self) -> None:
        urls = [f"{self.url(role)}/healthz" for role in self.roles]
        probe = subprocess.Popen(
            ["ip", "netns", "exec", self.host("client").netns, sys.executable, "-I", "-S", "-c", _PROBE,
             str(self.startup_timeout), *urls],
            env=self._env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
        state = self._load()
        servers = state.get("servers", {})
        charons = self.lab.pids
        out: dict[str, Any] = {"prefix": self.prefix, "state_dir": str(self.state_dir), "pool": self.pool}
        for name in ("client", "host", "target"):
            try:
                h = self.host(name)
            except KeyError:
                continue
            part: dict[str, Any] = {"netns": h.netns, "ike_address": h.ike_address,
                                    "charon_pid": charons.get(name), "charon_log": h.log_path}
            if name == "client":
                part["vici_socket"] = h.vici_socket
            if name == "target":
                part["protected"] = [f"{h.inside_address}/32"]
            if name in servers:
                s = servers[name]
                part.update(url=s["url"], pid=s["pid"], log=s["log"], config=s["config"],
                            database_url=s["database_url"])
                if name == "target" and self.combined:
                    part["plays"] = ["host", "target"]
            out[name] = part
        out["users"] = list(state.get("users", []))
        return out

    # -- users ----------------------------------------------------------------------------

    def enroll(self, user: str, objectives: Sequence[int] = ALL_OBJECTIVES) -> bool:
        """Make the user's key pair and client config if missing, and enrol the user at Host.

        Returns:
            Whether the user was enrolled now (False: enrolled already).

        Raises:
            AgentLabError: no lab is up, or the name is not a user name.
        """
        from app.adapters.db.agent import UserRepository
        from app.adapters.db.engine import make_engine, make_session_factory
        from app.domain.agent import EnrolledUser

        if not self.state_file.exists():
            raise AgentLabError(f"no agent lab is up in {self.state_dir} (qoss lab up --agent)")
        if not _USER.match(user) or user in (HOST_ID, TARGET_ID):
            raise AgentLabError(f"{user!r} is not a user name (a-z, 0-9, . _ -; not {HOST_ID} or {TARGET_ID})")
        if not self._pub(user).exists():
            write_keys(KeyPair.generate(user), self.key_dir)
        path = self.client_config_path(user)
        if not path.exists():
            client = self.host("client")
            write_config(path, client_config(
                user=user, key_dir=self.key_dir, host_id=TARGET_ID if self.combined else HOST_ID,
                host_url=self.url(self.host_server), host_key=self._pub(TARGET_ID if self.combined else HOST_ID),
                targets={TARGET_ID: self._pub(TARGET_ID)}, vici_socket=client.vici_socket,
                state_dir=self.state_dir / f"client-{user}", ike_address=client.ike_address), client=True)
        _, keys = load_public(self._pub(user))
        engine = make_engine(self.database_url(self.host_server))
        try:
            with make_session_factory(engine)() as session, session.begin():
                UserRepository(session).enroll(EnrolledUser(user_id=user, sign_public_key=keys.sign,
                                                            kem_public_key=keys.kem, objectives=frozenset(objectives)))
            enrolled = True
        except AlreadyExists:
            enrolled = False
        finally:
            engine.dispose()
        users = self._load().get("users", [])
        if user not in users:
            self._update(users=[*users, user])
        return enrolled

    def join(self, user: str, *, objective: int = 3, min_levels: Mapping[str, int] | None = None,
             pings: int = 3) -> dict[str, Any]:
        """Enrol ``user`` if needed, connect through the agent from the client's namespace, and ping
        Target's protected address from the virtual IP.

        Returns:
            ``user``, ``enrolled`` (now), ``virtual_ip``, ``suite`` (as the client's charon
            reports it), ``proposals`` (what Target negotiated), ``ticket``, ``conn``, ``ping``
            (``crossed``: replies came back and the CHILD_SA counted them), ``client_config``.

        Raises:
            AgentLabError: no lab is up, or the connect failed (the message is the client's).
        """
        enrolled = self.enroll(user)
        args = ["connect", "--target", TARGET_ID, "--objective", str(objective)]
        for level, value in (min_levels or {}).items():
            args += [f"--{level.replace('_', '-')}", str(value)]
        done = self.agent(user, *args, check=False)
        if done.returncode != 0:
            raise AgentLabError(f"{user} could not connect: {_client_error(done.stderr)}")
        report = json.loads(done.stdout)
        result: dict[str, Any] = {
            "user": user, "enrolled": enrolled, "virtual_ip": report.get("virtual_ip"),
            "suite": None, "proposals": {"ike": report.get("ike_proposal"), "esp": report.get("esp_proposal")},
            "protection": report.get("protection"), "ticket": report.get("ticket"), "conn": report.get("conn"),
            "ping": None, "client_config": str(self.client_config_path(user)),
        }
        if report.get("conn") is None or report.get("virtual_ip") is None:
            return result  # Target granted no tunnel (native protection)
        gateway = self.host("client").gateway(10.0)
        try:
            before = gateway.list_sas(ike=report["conn"])
            target = self.host("target").inside_address
            result["ping"] = self._ping(report["virtual_ip"], target, pings)
            after = gateway.list_sas(ike=report["conn"])
        except GatewayError as exc:
            raise AgentLabError(f"cannot read the client's charon: {exc.message}") from exc
        if after:
            result["suite"] = charon_suite(after[0])
        counts = [(c.packets_out, c.packets_in) for sa in (before[:1] + after[:1]) for c in sa.children[:1]]
        if len(counts) == 2:
            out, back = counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]
            result["ping"]["esp_packets"] = {"out": out, "in": back}
            received = result["ping"]["received"]
            result["ping"]["crossed"] = received > 0 and out >= received and back >= received
        return result

    def _ping(self, source: str, destination: str, count: int) -> dict[str, Any]:
        done = subprocess.run(
            ["ip", "netns", "exec", self.host("client").netns, "ping", "-n", "-q", "-c", str(count), "-i", "0.2",
             "-W", "2", "-I", source, destination],
            capture_output=True, text=True, timeout=10 + 3 * count, check=False, env=self._env(),
        )
        sent = re.search(r"(\d+) packets transmitted, (\d+) received", done.stdout)
        rtt = re.search(r"= [\d.]+/([\d.]+)/", done.stdout)
        return {"from": source, "to": destination, "transmitted": int(sent.group(1)) if sent else count,
                "received": int(sent.group(2)) if sent else 0, "rtt_avg_ms": float(rtt.group(1)) if rtt else None,
                "crossed": False}

    # -- status / down ------------------------------------------------------------------

    def status(self) -> AgentLabStatus:
        """The lab's namespaces, charons and sockets, whether each server runs, the users."""
        state = self._load()
        servers = {role: _running_as(int(s["pid"]), "QOSS_AGENT_CONFIG", str(s["config"]))
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
        for s in self._load().get("servers", {}).values():
            if _running_as(int(s["pid"]), "QOSS_AGENT_CONFIG", str(s["config"])):
                victims.add(int(s["pid"]))
        victims.update(p.pid for p in self._servers.values() if p.poll() is None)
        stop_processes(sorted(victims), grace)
        for proc in self._servers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        self._servers.clear()
        self.lab.down()
        if self.state_file.exists() or (self.state_dir / "lab").exists():  # a directory this lab made
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _client_error(stderr: str) -> str:
    """The client's error in one line (``qoss agent`` prints a JSON error document)."""
    text = stderr.strip()
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        doc = json.loads(text)
        detail = doc.get("detail")
        message = detail.get("message") if isinstance(detail, dict) else detail
        return f"{doc.get('error')}: {message}"
    lines = text.splitlines()
    return lines[-1] if lines else "no message"

