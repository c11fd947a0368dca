"""Two peered sites: each a network namespace with its own charon and its own ``qoss serve``.

Two lab hosts (:class:`app.lab.hosts.Lab`: ``site-a`` and ``site-b``, namespaces
``<prefix>-site-a`` and ``<prefix>-site-b``) joined by a veth pair on the lab network
:data:`NETWORK` (``10.77.0.1``, ``10.77.0.2``), each with its inside address on ``lo``
(``10.1.0.1``, ``10.2.0.1``) and its charon (kernel-libipsec). Each site runs ``qoss serve``
inside its namespace, listening on its lab address at :data:`PORT`, with everything of its
own: its SQLite database (so its own rating tables, policies and tokens), its state directory
(where ``QOSS_PEER_NAME`` makes its peering keys at start), and its charon's socket as the
only one it may drive. The two services talk to each other over the lab network.

From the root namespace each site's API is reached at ``http://127.0.0.1:<port>``: a relay
(:mod:`app.lab.relay`) whose listening socket is made in the root namespace and whose
upstream connections are made in the site's namespace. No route, address or interface is
added to the root namespace.

Then the lab does what each site's administrator would do: makes the site's first admin
token with ``qoss token create --scopes admin --plain`` against the site's database,
registers the site's charon as a gateway (``POST /v1/gateways``), and registers the other
site as a peer (:meth:`PeersLab.peer`: ``GET /v1/peering/identity`` on one side, ``POST
/v1/peers`` on the other, both ways).

Everything lives under ``state_dir``::

    peers.json            what is up: prefix, port, each site's pids and relay port (no tokens)
    lab/                  the Lab: charons' configs, VICI sockets, logs, lab.json
    site-a/, site-b/      each site's state directory: qoss.db, serve.log, relay.log, peering keys

Every process the lab starts carries ``QOSS_LAB=<state_dir>`` in its environment, so
:meth:`PeersLab.down` finds it whatever the record says: it works from another process and
after a partial :meth:`PeersLab.up`. Needs root, as :class:`~app.lab.hosts.Lab` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from app.lab.hosts import Lab, LabHost
from app.lab.processes import (
    PRIVATE_UMASK,
    LabError,
    LabRecord,
    open_private_log,
    private_dir,
    processes_with_env,
    running_with_env,
    stop_started,
)

__all__ = ["MARK", "NETWORK", "PORT", "SITES", "PeersLab", "PeersLabError"]

#: The two sites, in order: each is the other's peer.
SITES = ("site-a", "site-b")
#: The lab network the sites' IKE, ESP and API traffic crosses (no other lab uses it).
NETWORK = "10.77.0.0/24"
#: Where each site's ``qoss serve`` listens, on its lab address inside its namespace.
PORT = 8500
#: Marks every process the lab starts (value: the state directory).
MARK = "QOSS_LAB"
#: The minimum levels each site asks of its peer's tunnels when it registers it.
MIN_LEVELS = {"confidentiality": 1, "integrity": 1, "key_exchange": 1}
_ROOT = Path(__file__).resolve().parents[2]  # where the ``app`` package this process runs was imported from
_ADMIN = "lab-admin"  # the name of each site's first admin token


class PeersLabError(LabError):
    """The peers lab could not be built (the message says which step and why)."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _answer(response: httpx.Response, what: str, expected: int) -> Any:
    if response.status_code != expected:
        raise PeersLabError(f"{what}: {response.status_code} {response.text[:500]}")
    return response.json()


class PeersLab:
    """Sites ``site-a`` and ``site-b``, each with its charon and its ``qoss serve``, peered; under ``state_dir``.

    Args:
        state_dir: where everything goes (not under /run; short: it holds UNIX sockets).
        prefix: namespace name prefix (``<prefix>-site-a``, ``<prefix>-site-b``).
        port: the port each site's service listens on, inside its namespace.
        server_env: extra environment for both services (``QOSS_`` settings).
        startup_timeout: seconds for both services to answer ``/healthz``.

    A lab recorded in ``state_dir`` keeps the prefix and port it was built with.
    """

    def __init__(self, state_dir: Path, prefix: str = "qoss", *, port: int = PORT,
                 server_env: Mapping[str, str] | None = None, startup_timeout: float = 60.0) -> None:
        self.state_dir = Path(state_dir).resolve()
        self._state = LabRecord(self.state_dir / "peers.json")
        recorded = self._state.load()
        self.prefix = str(recorded.get("prefix", prefix))
        self.port = int(recorded.get("port", port))
        self.server_env = dict(server_env or {})
        self.startup_timeout = startup_timeout
        self.lab = Lab(self.state_dir / "lab", prefix=self.prefix, ike_network=NETWORK)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._tokens: dict[str, str] = {}

    # -- state ------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``state_dir/peers.json``."""
        return self._state.path

    @property
    def recorded(self) -> bool:
        """Whether a lab (or what is left of one) is recorded in ``state_dir``."""
        return self.state_file.exists() or self.lab.state_file.exists()

    def _record(self, site: str, **changes: Any) -> None:
        state = self._state.load()
        sites = state.setdefault("sites", {})
        sites[site] = {**sites.get(site, {}), **changes}
        self._state.save(state)

    # -- where things are ---------------------------------------------------------------

    def host(self, site: str) -> LabHost:
        """The lab host of ``site`` (``site-a`` or ``site-b``).

        Raises:
            KeyError: no such site in the lab that is up.
        """
        return self.lab.host(site)

    def site_dir(self, site: str) -> Path:
        """``site``'s state directory (its database, logs and peering keys)."""
        return self.state_dir / site

    def database_url(self, site: str) -> str:
        """``site``'s database."""
        return f"sqlite:///{self.site_dir(site) / 'qoss.db'}"

    def lab_url(self, site: str) -> str:
        """``site``'s API as the lab network reaches it (from inside either namespace)."""
        return f"http://{self.host(site).gateway_ike_address}:{self.port}"

    def url(self, site: str) -> str:
        """``site``'s API as the root namespace reaches it (through its relay).

        Raises:
            KeyError: the site has no relay (the lab is not up).
        """
        return f"http://127.0.0.1:{int(self._state.load()['sites'][site]['relay_port'])}"

    @staticmethod
    def other(site: str) -> str:
        """The other site: ``site``'s peer."""
        return SITES[1 - SITES.index(site)]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment without its ``QOSS_`` settings, the lab's mark, and the ``app`` this process runs."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("QOSS_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env[MARK] = str(self.state_dir)
        return {**env, **(extra or {})}

    def site_env(self, site: str) -> dict[str, str]:
        """The environment of ``site``'s service and of the admin's commands against its database."""
        return self.env({
            "QOSS_DATABASE_URL": self.database_url(site), "QOSS_STATE_DIR": str(self.site_dir(site)),
            "QOSS_PEER_NAME": site, "QOSS_LOG_LEVEL": "warning",
            "QOSS_VICI_SOCKET_DIRS": json.dumps([str(Path(self.host(site).vici_socket).parent)]),
            # no client configuration file: the admin's commands act on the site's database itself
            "XDG_CONFIG_HOME": str(self.site_dir(site) / "config"),
            **self.server_env,
        })

    # -- up -------------------------------------------------------------------------------

    def up(self) -> dict[str, Any]:
        """Build both sites, start their services and relays, make their tokens, register their
        gateways and peer them; on any failure take down what was built and raise.

        Returns:
            What :meth:`describe` returns: ``{"sites": {"site-a": {...}, "site-b": {...}}}``.

        Raises:
            PeersLabError: a lab is recorded in ``state_dir`` already, or a step failed (the
                message has the services' last log lines; the lab is down again).
        """
        if self.recorded:
            raise PeersLabError(f"a peers lab is recorded in {self.state_dir}: take it down first (qoss lab down)")
        self._state.save({"prefix": self.prefix, "port": self.port, "sites": {}})
        try:
            self.build()
            self.peer()
        except Exception as exc:
            logs = "".join(f"\n--- {site}/serve.log ---\n{text}" for site in SITES
                           if (text := _tail(self.site_dir(site) / "serve.log")))
            self.down()
            raise PeersLabError(f"{exc}{logs}") from exc
        except BaseException:
            self.down()
            raise
        return self.describe()

    def build(self) -> None:
        """Everything but the peering: namespaces, charons, services, relays, tokens, gateways."""
        self.lab.up(names=list(SITES))
        for site in SITES:
            private_dir(self.site_dir(site))
            self._serve(site)
            self._relay(site)
        self._wait_ready()
        self._make_tokens()
        for site in SITES:
            self._register_gateway(site)

    def _serve(self, site: str) -> None:
        h = self.host(site)
        cmd = ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.cli", "serve",
               "--host", h.gateway_ike_address, "--port", str(self.port)]
        with open_private_log(self.site_dir(site) / "serve.log") as log:  # the server keeps its own copy
            proc = subprocess.Popen(cmd, env=self.site_env(site), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.site_dir(site), umask=PRIVATE_UMASK)
        self._procs[f"{site} serve"] = proc
        self._record(site, pid=proc.pid)

    def _relay(self, site: str) -> None:
        h = self.host(site)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            port = int(listener.getsockname()[1])
            cmd = ["ip", "netns", "exec", h.netns, sys.executable, "-m", "app.lab.relay",
                   "--fd", str(listener.fileno()), "--to", f"{h.gateway_ike_address}:{self.port}"]
            with open_private_log(self.site_dir(site) / "relay.log") as log:
                proc = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                        pass_fds=(listener.fileno(),), start_new_session=True,
                                        cwd=self.site_dir(site), umask=PRIVATE_UMASK)
        self._procs[f"{site} relay"] = proc
        self._record(site, relay_pid=proc.pid, relay_port=port)

    def _check_running(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise PeersLabError(f"the {name} process exited with {proc.returncode}")

    def _wait_ready(self) -> None:
        """Until each site's ``/healthz`` answers 200 through its relay (the relay and the service both up)."""
        pending = {site: f"{self.url(site)}/healthz" for site in SITES}
        deadline = time.monotonic() + self.startup_timeout
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while pending:
                self._check_running()
                for site, url in list(pending.items()):
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(url).status_code == 200:
                            del pending[site]
                if pending and time.monotonic() > deadline:
                    raise PeersLabError(f"{', '.join(pending.values())} did not answer within "
                                        f"{self.startup_timeout:g} s")
                if pending:
                    time.sleep(0.1)

    def _make_tokens(self) -> None:
        """Each site's first admin token, made as its administrator would: ``qoss token create
        --scopes admin --plain`` against the site's database (both at once)."""
        running = {site: subprocess.Popen(
            [sys.executable, "-m", "app.cli", "token", "create", "--name", _ADMIN, "--scopes", "admin",
             "--plain"], env=self.site_env(site), cwd=self.site_dir(site), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, umask=PRIVATE_UMASK) for site in SITES}
        problems = []
        for site, proc in running.items():
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                problems.append(f"{site}: qoss token create did not finish within 60 s")
                continue
            token = out.decode().strip()
            if proc.returncode != 0 or not token:
                problems.append(f"{site}: qoss token create failed: {err.decode(errors='replace').strip()[-500:]}")
            else:
                self._tokens[site] = token
        if problems:
            raise PeersLabError("; ".join(problems))

    def _client(self, site: str) -> httpx.Client:
        return httpx.Client(base_url=self.url(site), trust_env=False, timeout=30.0,
                            headers={"Authorization": f"Bearer {self._tokens[site]}"})

    def _register_gateway(self, site: str) -> None:
        h = self.host(site)
        body = {"name": site, "vici_socket": h.vici_socket, "ike_address": h.gateway_ike_address,
                "inside_networks": h.inside_networks}
        with self._client(site) as client:
            _answer(client.post("/v1/gateways", json=body), f"{site}: POST /v1/gateways", 201)

    def peer(self) -> None:
        """Register each site at the other, as their administrators would: read each site's
        peering identity (``GET /v1/peering/identity``), then on each site ``POST /v1/peers``
        naming the other site, its URL on the lab network and its public keys, this site's
        gateway and inside networks, and :data:`MIN_LEVELS`.

        Raises:
            PeersLabError: a site refused (the message has its answer).
            KeyError: the lab is not up (no tokens: call :meth:`up`).
        """
        identities = {}
        for site in SITES:
            with self._client(site) as client:
                identities[site] = _answer(client.get("/v1/peering/identity"),
                                           f"{site}: GET /v1/peering/identity", 200)
        for site in SITES:
            other = self.other(site)
            body = {"name": other, "url": self.lab_url(other),
                    "sign_public_key": identities[other]["sign_public_key"],
                    "kem_public_key": identities[other]["kem_public_key"],
                    **({"mlkem_public_key": identities[other]["mlkem_public_key"]}
                       if "mlkem_public_key" in identities[other] else {}),
                    "gateways": [site], "networks": self.host(site).inside_networks, "min_levels": MIN_LEVELS}
            with self._client(site) as client:
                _answer(client.post("/v1/peers", json=body), f"{site}: POST /v1/peers", 201)

    def describe(self) -> dict[str, Any]:
        """Each site: ``url`` (from the root namespace), ``token`` (known to the process that
        made it, else None), ``gateway``, ``inside``, ``netns``, ``vici``, ``pid``, and ``lab_url``
        (from the lab network)."""
        recorded = self._state.load().get("sites", {})
        sites = {}
        for site in SITES:
            with contextlib.suppress(KeyError):
                h = self.host(site)
                sites[site] = {"url": self.url(site), "token": self._tokens.get(site), "gateway": site,
                               "inside": h.inside_address, "netns": h.netns, "vici": h.vici_socket,
                               "pid": int(recorded[site]["pid"]), "lab_url": self.lab_url(site)}
        return {"sites": sites}

    # -- status / down ------------------------------------------------------------------

    def running(self) -> dict[str, bool]:
        """Whether each recorded service and relay still runs (``"site-a serve"``, ``"site-a relay"``, ...)."""
        out = {}
        for site, s in self._state.load().get("sites", {}).items():
            for kind, key in (("serve", "pid"), ("relay", "relay_pid")):
                if key in s:
                    out[f"{site} {kind}"] = running_with_env(int(s[key]), MARK, str(self.state_dir))
        return out

    def down(self, grace: float = 10.0) -> None:
        """Stop the services, relays and any process the lab started, then the charons; delete
        the namespaces; remove ``state_dir``. Idempotent, safe after a partial :meth:`up` and
        from another process.

        Raises:
            LabError: a namespace could not be deleted (the state is kept, to try again).
        """
        victims = set(processes_with_env(MARK, self.state_dir, exact=True))
        for s in self._state.load().get("sites", {}).values():
            for key in ("pid", "relay_pid"):
                if key in s and running_with_env(int(s[key]), MARK, str(self.state_dir)):
                    victims.add(int(s[key]))
        stop_started(self._procs, victims, grace)
        self._tokens.clear()
        self.lab.down()
        if self.recorded or (self.state_dir / "lab").exists():  # a directory this lab made
            shutil.rmtree(self.state_dir, ignore_errors=True)
