"""The agent's Client role (Liu et al. §2.2 steps 1 and 6): ask, verify the answer, bring the tunnel up.

``connect`` signs a request with the user's Ed25519 key and seals it to Host, then
opens Target's answer with the user's X25519 key and checks it: Target's signature,
that it answers *this* request (request id), is for this user via this host, and is
fresh. Only then does it load the session key and the conn into the local charon,
initiate, and check with ``list-sas`` that charon negotiated exactly the suite Target
chose, all in one pipelined VICI exchange; the virtual IP comes from Target's pool.
What the client remembers of a tunnel (ticket, conn, suite, virtual IP, expiry; never
the key) is a file in ``state_dir``.
Any failure after Target configured its side asks Target (through Host) to close it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.domain.agent import (
    AgentRejected,
    ClientRequest,
    Handoff,
    Kind,
    RequestInfo,
    Response,
    TunnelingInfo,
    agent_conn_name,
    b64e,
    check_fresh,
    client_conn,
    sealed_hybrid,
)
from app.domain.agent.conns import ppk_name
from app.domain.agent.ports import AgentCrypto, AgentKeys, PeerKeys, Post
from app.domain.agent.sealed_profile import KEY_BYTES, NONCE_BYTES, header
from app.domain.errors import GatewayError, InvalidInput, QossError, TunnelVerificationFailed
from app.domain.ports import (
    CharonCommand,
    Initiate,
    ListSas,
    LoadConn,
    LoadShared,
    Terminate,
    Unload,
    UpReports,
    ViciPort,
)
from app.domain.tunnels import expected_sa, keywords_from_charon, mismatches
from app.services import tunnel_setup
from app.services.agent.config import ClientConfig
from app.services.agent.timing import Steps
from app.services.tunnel_setup import INITIATE_TIMEOUT_MS, came_up, observed_sa

__all__ = ["CAPABILITIES_TTL", "HANDOFF_PAGE", "AgentClient", "ca_fingerprint", "seal_profile"]

log = logging.getLogger("qoss.agent.client")

#: The page (served by Host, ``app.ui.pages.handoff``) a one-time link opens on the phone.
HANDOFF_PAGE = "/ui/handoff"
_LINK_SECRET = re.compile(r"[A-Za-z0-9_-]{20,64}")


def seal_profile(key: bytes, *, media_type: str, name: str, profile: bytes) -> bytes:
    """``profile`` sealed for a one-time link under ``key`` (32 bytes): AES-256-GCM with a random
    nonce, its clear line (media type, file name) as associated data
    (:mod:`app.domain.agent.sealed_profile`)."""
    line = header(media_type=media_type, name=name)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return line + nonce + AESGCM(key).encrypt(nonce, profile, line)


def ca_fingerprint(ca_cert_der: bytes) -> str:
    """The SHA-256 fingerprint of a CA certificate (DER) as certificate viewers show it:
    32 upper-case hex pairs joined by colons."""
    return ":".join(f"{b:02X}" for b in hashlib.sha256(ca_cert_der).digest())

_CAPS_FILE = "capabilities.json"
#: What a capabilities file holds: 2 counts a PPK from charon's version (a file of 1 is read again).
_CAPS_FORMAT = 2
#: Cached charon capabilities are read again after this many seconds (and whenever charon restarts).
CAPABILITIES_TTL = 3600.0


def _write_private(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` (0600), replacing it atomically."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


class AgentClient:
    """The mobile user's side: one user, one Host, the targets it knows, its own charon.

    Args:
        keys: the user's own keys; ``crypto`` checks signatures and reads public keys.
        vici: the local charon.
        post: sends a message to Host.
        reports: the local charon's reports of SAs coming up. When they arrive, the tunnel is
            initiated without waiting in charon and the report is what is verified
            (:meth:`_bring_up`); without them, charon waits and ``list-sas`` is read.
    """

    def __init__(self, *, config: ClientConfig, keys: AgentKeys, crypto: AgentCrypto, vici: ViciPort, post: Post,
                 clock: Callable[[], float] = time.time, reports: UpReports | None = None) -> None:
        self.config = config
        self.keys = keys
        self._crypto = crypto
        self.vici = vici
        self.host = config.host_ref
        self.host_keys: PeerKeys = self.host.keys(config.base_dir, crypto)
        self.targets = {n: p.keys(config.base_dir, crypto) for n, p in config.targets.items()}
        self._post = post
        self._clock = clock
        self._reports = reports
        self._caps: tuple[list[int], float, tuple[str, ...], bool] | None = None
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qoss-agent-client")
        #: The last connect's record being rewritten with its virtual IP (:meth:`tunnels` waits for it;
        #: so does the interpreter at exit, for the loader's threads).
        self._rewrite: Future[None] | None = None
        #: Where the last connect's time went (step -> ms; no secrets), for benchmarks.
        self.last_steps: dict[str, float] = {}
        #: The same steps in CPU time of the connecting thread (ms).
        self.last_steps_cpu: dict[str, float] = {}

    # -- messages -------------------------------------------------------------------------

    def request(self, kind: Kind, info: RequestInfo, objective_id: int) -> tuple[ClientRequest, bytes]:
        """A signed request sealed to Host: (request, wire)."""
        if info.target not in self.targets:
            raise InvalidInput(f"target {info.target} is not in the client config")
        request = ClientRequest(kind=kind, request_id=secrets.token_bytes(16), user_id=self.config.user,
                                objective_id=objective_id, request_info=info, host=self.host.id,
                                timestamp=int(self._clock()))
        wire = self.keys.seal(kind=kind, to=self.host.id, body=request.body(), recipient=self.host_keys.kem,
                              recipient_mlkem=self.host_keys.mlkem)
        return request, wire

    def accept(self, answer: bytes, request: ClientRequest) -> Response:
        """Open and check Target's answer to ``request``.

        Raises:
            AgentRejected: not sealed to this user, not signed by the target, not the answer to
                this request (e.g. an old response replayed), stale, or carrying a post-quantum
                preshared key sealed with X25519 alone.
        """
        want = {Kind.DISCONNECT: Kind.CLOSED, Kind.STATUS: Kind.STATE,
                Kind.DEVICES: Kind.DEVICE_LIST}.get(request.kind, Kind.RESPONSE)
        kind, body, tag = self.keys.open_sealed(answer, kinds=[want])
        response = Response.parse(body, kind=kind)
        target = request.request_info.target
        self._crypto.verify(self.targets[target].sign, kind, body, tag)
        if response.tunneling_info is not None and response.tunneling_info.suite.get("post_quantum") \
                and not sealed_hybrid(answer):
            raise AgentRejected("a post-quantum preshared key sealed with X25519 alone")
        if response.target != target or response.user_id != self.config.user or response.host != self.host.id:
            raise AgentRejected("the response is for another party")
        if not secrets.compare_digest(response.request_id, request.request_id):
            raise AgentRejected("the response answers another request")
        check_fresh(response.timestamp, self._clock())
        return response

    def _send(self, request: ClientRequest, wire: bytes) -> Response:
        return self.accept(self._post(f"{self.host.url}/v1/agent/requests", wire), request)

    # -- connect / disconnect ------------------------------------------------------------------

    def _charon_key(self) -> list[int] | None:
        """What identifies the running charon: its VICI socket's device, inode and change time.

        charon makes a new socket each time it starts, so a restart (the only way to change
        its plugins, hence its algorithms and back end) changes the key. None: no socket.
        """
        try:
            info = os.stat(self.config.vici_socket)
        except OSError:
            return None
        return [info.st_dev, info.st_ino, info.st_ctime_ns]

    def _caps_path(self) -> Path:
        return self.config.state_dir / _CAPS_FILE

    def _cached_capabilities(self, key: list[int]) -> tuple[tuple[str, ...], bool] | None:
        now = self._clock()
        if self._caps is not None and self._caps[0] == key and now - self._caps[1] < CAPABILITIES_TTL:
            return self._caps[2], self._caps[3]
        try:
            raw = json.loads(self._caps_path().read_text())
            if (raw.get("format") == _CAPS_FORMAT and raw["key"] == key
                    and 0 <= now - float(raw["at"]) < CAPABILITIES_TTL
                    and isinstance(raw["native"], bool) and isinstance(raw["algorithms"], list)
                    and all(isinstance(a, str) for a in raw["algorithms"])):
                self._caps = (key, float(raw["at"]), tuple(raw["algorithms"]), raw["native"])
                return self._caps[2], self._caps[3]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def capabilities(self, *, refresh: bool = False) -> tuple[tuple[str, ...], bool]:
        """(algorithm keywords of the local charon, whether it can do AH and transport mode).

        Read with VICI ``get-algorithms`` and ``stats``, then cached in memory and in
        ``state_dir/capabilities.json``, keyed on the charon (:meth:`_charon_key`): a restarted
        charon is read again, and so is one read more than :data:`CAPABILITIES_TTL` seconds ago
        or when ``refresh`` is true (``qoss agent connect --refresh``).
        """
        key = self._charon_key()
        if key is not None and not refresh:
            cached = self._cached_capabilities(key)
            if cached is not None:
                return cached
        algorithms = tuple(sorted(keywords_from_charon(self.vici.get_algorithms().as_sections(),
                                                       version=self.vici.version().version)))
        native = self.vici.stats().backend != "kernel-libipsec"
        if key is not None and key == self._charon_key():
            now = self._clock()
            self._caps = (key, now, algorithms, native)
            with contextlib.suppress(OSError):
                self.config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                _write_private(self._caps_path(), json.dumps(
                    {"format": _CAPS_FORMAT, "key": key, "at": now, "algorithms": list(algorithms), "native": native}))
        return algorithms, native

    def connect(self, *, target: str, objective_id: int, min_levels: Mapping[str, int] | None = None,
                lifetime: int = 600, refresh: bool = False) -> dict[str, Any]:
        """Ask for a tunnel to ``target`` and bring it up; the report (no key material).

        Raises:
            AgentRejected: Host or Target rejected the request, or the answer is not genuine.
            RemoteRefused: e.g. 409 when nothing meets the minimums.
            GatewayError: the local charon failed (Target's side is closed again).
        """
        steps = Steps("client")
        supports, native = self.capabilities(refresh=refresh)
        steps.mark("capabilities")
        info = RequestInfo(target=target, min_levels=dict(min_levels or {}), supports=supports, ah=native,
                           transport=native, lifetime=lifetime, ike_address=self.config.ike_address)
        request, wire = self.request(Kind.CONNECT, info, objective_id)
        steps.mark("seal")
        # Whether charon's reports arrive is learnt while Host and Target work (the listener's
        # first start connects and registers with charon).
        detached = self._loader.submit(self._reports.detached, self.vici.socket_path) \
            if self._reports is not None else None
        answer = self._post(f"{self.host.url}/v1/agent/requests", wire)
        steps.mark("host")
        response = self.accept(answer, request)
        steps.mark("accept")
        tunnel = response.tunneling_info
        assert tunnel is not None  # Response.parse guarantees it for a RESPONSE
        report: dict[str, Any] = {
            "ticket": tunnel.ticket, "target": target, "protection": tunnel.protection,
            "suite": dict(tunnel.suite), "esp_proposal": tunnel.esp_proposal, "ike_proposal": tunnel.ike_proposal,
            "notes": list(tunnel.notes), "expires": tunnel.expires, "remote_ts": list(tunnel.remote_ts),
            "virtual_ip": None, "conn": None,
        }
        if tunnel.protection == "native":
            return report
        name = agent_conn_name(tunnel.ticket)
        report["conn"] = name
        try:
            vip = self._bring_up(name, response, steps, report, objective_id,
                                 detached=detached is not None and detached.result())
        except BaseException:
            self._teardown(name, ppk=tunnel.ppk_id is not None)
            with contextlib.suppress(Exception):
                self._disconnect_remote(target, tunnel.ticket, objective_id)
            raise
        report["virtual_ip"] = vip
        if vip is not None:  # the address is known now: rewritten in the background (see tunnels())
            self._settle()
            self._rewrite = self._loader.submit(self._remember, dict(report), objective_id)
        steps.mark("remember")
        steps.done()
        self.last_steps, self.last_steps_cpu = steps.as_dict(), steps.as_dict(cpu=True)
        return report

    def _bring_up(self, name: str, response: Response, steps: Steps, report: Mapping[str, Any],
                  objective_id: int, *, detached: bool) -> str | None:
        """Load secret and conn, initiate, and check that charon negotiated exactly Target's suite:
        the virtual IP.

        The commands go to charon in one write on one connection, which charon works through in
        order: one round trip. ``detached`` (charon's reports arrive): ``load-shared``,
        ``load-conn`` and ``initiate`` without waiting (charon answers at once, holds none of its
        worker threads and streams no log while the IKE_SA is negotiated); charon's report of
        the CHILD_SA coming up is what is verified. No report within a second, or one that does
        not match: ``list-sas`` decides, once the SAs are up (:func:`came_up`: a failed initiate
        is asked again, waiting, for charon's reason). Otherwise ``initiate`` waits in charon and
        ``list-sas`` is the fourth command. While charon works, the ticket's record (``report``,
        no address yet) is written; if anything fails, it is removed again (and the caller
        unloads what loaded).
        """
        tunnel = response.tunneling_info
        assert tunnel is not None
        assert response.session_key is not None
        ppk: list[CharonCommand] = [] if tunnel.ppk_id is None or response.ppk is None else [
            LoadShared(ppk_name(name), response.ppk, (tunnel.ppk_id,), "PPK")]  # Response.parse: both or neither
        commands: list[CharonCommand] = [
            LoadShared(name, response.session_key, (tunnel.client_identity, tunnel.target_identity)), *ppk,
            LoadConn(name, client_conn(name=name, info=tunnel, client_address=self.config.ike_address)),
        ]
        with contextlib.ExitStack() as stack:
            wait = None
            if detached:
                assert self._reports is not None
                wait = stack.enter_context(self._reports.expect(self.vici.socket_path, name))
                commands.append(Initiate(child=name, ike=name, timeout_ms=-1))
            else:
                commands += [Initiate(child=name, ike=name, timeout_ms=INITIATE_TIMEOUT_MS), ListSas(ike=name)]
            until = time.monotonic() + INITIATE_TIMEOUT_MS / 1000
            try:
                with self.vici.pipeline() as charon:
                    charon.send(commands)
                    try:
                        self._remember(report, objective_id)
                    finally:
                        replies = charon.finish()  # read even if the record could not be written
                for reply in replies:
                    if isinstance(reply, GatewayError):
                        raise reply  # the first refusal says why (a failed load fails the initiate)
                if wait is None:
                    steps.mark("initiate")
                    vip = self._check(name, tunnel, replies[3])  # the IKE_SAs (a refusal was raised above)
                else:
                    vip = self._reported(name, tunnel, wait, until)
                    steps.mark("initiate")
            except BaseException:
                self._forget(tunnel.ticket)
                raise
        steps.mark("verify")
        return vip

    def _reported(self, name: str, tunnel: TunnelingInfo, wait: Callable[[float], Any], until: float) -> str | None:
        """After an initiate that did not wait: the virtual IP, from charon's report of conn
        ``name`` if it shows exactly Target's suite, else from ``list-sas`` once the SAs are up."""
        sa = wait(tunnel_setup.REPORT_WAIT)
        if sa is not None:
            try:
                return self._check(name, tunnel, [sa])
            except TunnelVerificationFailed as exc:
                log.info("charon's report of %s does not match (%s); asking list-sas", name, exc.message)
        else:
            came_up(self.vici, "client", name, until)
        return self._check(name, tunnel, self.vici.list_sas(ike=name))

    @staticmethod
    def _check(name: str, tunnel: TunnelingInfo, sas: list[Any]) -> str | None:
        """The virtual IP of conn ``name`` once its SAs are exactly Target's suite.

        Raises:
            TunnelVerificationFailed: no such IKE_SA, or another suite than Target's.
        """
        suite = tunnel.suite
        expected = expected_sa(ike=suite.get("ike", {}), protocol=str(suite.get("protocol")),
                               encryption=suite.get("encryption"), integrity=suite.get("integrity"),
                               post_quantum=suite.get("post_quantum"))
        seen = observed_sa(sas, name)
        if seen is None:
            raise TunnelVerificationFailed(f"no IKE_SA {name} after initiate")
        wrong = mismatches(expected, seen)
        if wrong:
            raise TunnelVerificationFailed("; ".join(wrong))
        vips = next((sa.local_vips for sa in sas if sa.name == name), ())
        return vips[0] if vips else None

    def _teardown(self, name: str, *, ppk: bool) -> None:
        # One pipelined batch; nothing up, or what was not loaded, is refused: nothing to do.
        with contextlib.suppress(GatewayError):
            self.vici.batch([Terminate(name), Unload("conn", name), Unload("shared", name),
                             *([Unload("shared", ppk_name(name))] if ppk else [])])

    def _disconnect_remote(self, target: str, ticket: str, objective_id: int) -> None:
        info = RequestInfo(target=target, ticket=ticket)
        request, wire = self.request(Kind.DISCONNECT, info, objective_id)
        self._send(request, wire)

    def disconnect(self, ticket: str | None = None) -> list[str]:
        """Tear down one tunnel (or all this client has): locally, then at Target through Host.

        Returns:
            the tickets closed.

        Raises:
            InvalidInput: no such ticket here.
        """
        known = self.tunnels()
        chosen = [t for t in known if ticket is None or t["ticket"] == ticket]
        if ticket is not None and not chosen:
            raise InvalidInput(f"no tunnel with ticket {ticket} in {self.config.state_dir}")
        closed = []
        for t in chosen:
            self._teardown(t["conn"], ppk=_has_ppk(t))
            try:
                self._disconnect_remote(t["target"], t["ticket"], int(t["objective_id"]))
            except AgentRejected:
                log.info("target no longer knew ticket %s (expired or revoked)", t["ticket"])
            self._forget(t["ticket"])
            closed.append(t["ticket"])
        return closed

    # -- devices ------------------------------------------------------------------------

    def enrol_device(self, *, target: str, objective_id: int, platform: str, out_dir: Path,
                     min_levels: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Enrol a phone or laptop: ask Target (through Host, as for a tunnel) for a device
        credential and a profile for ``platform``'s VPN client, and write them into ``out_dir``
        (files 0600). The report names the profile and carries the PKCS#12's one-time passphrase,
        which is kept nowhere (the record in ``state_dir`` has the ticket, to revoke it), and beside
        it ``ca_fingerprint``, the SHA-256 of the gateway's CA certificate, for the user to compare
        with what the device shows when it imports the profile.

        Raises:
            AgentRejected: Host or Target rejected the request, or the answer is not genuine.
            RemoteRefused: e.g. 409 when the platform cannot meet the minimums.
        """
        info = RequestInfo(target=target, min_levels=dict(min_levels or {}), platform=platform)
        request, wire = self.request(Kind.CONNECT, info, objective_id)
        response = self._send(request, wire)
        device, tunnel = response.device, response.tunneling_info
        if device is None or tunnel is None or device.platform != platform:
            raise AgentRejected("the answer carries no profile for this platform")
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        written = {}
        for name, data in {device.profile_name: device.profile, **device.files}.items():
            path = out_dir / name  # names are checked when the answer is parsed: no folders, no dot files
            _write_private(path, data)
            written[name] = str(path)
        report: dict[str, Any] = {
            "ticket": tunnel.ticket, "target": target, "platform": platform,
            "profile": written[device.profile_name], "media_type": device.media_type,
            "files": [written[n] for n in device.files], "passphrase": device.passphrase,
            "ca_fingerprint": ca_fingerprint(device.ca_cert),
            "suite": dict(tunnel.suite), "ike_proposal": tunnel.ike_proposal, "esp_proposal": tunnel.esp_proposal,
            "gateway": {"address": tunnel.target_address, "identity": tunnel.target_identity},
            "identity": tunnel.client_identity, "remote_ts": list(tunnel.remote_ts), "expires": device.not_after,
        }
        record = {k: v for k, v in report.items() if k != "passphrase"}
        devices = self.config.state_dir / "devices"
        devices.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(devices / f"{tunnel.ticket}.json", json.dumps({**record, "objective_id": objective_id},
                                                                      indent=2))
        return report

    def handoff(self, report: Mapping[str, Any], *, ttl: int = 600, link_base: str | None = None) -> str:
        """Leave the profile of a device just enrolled (``report`` from :meth:`enrol_device`) at Host
        for one download within ``ttl`` seconds: the link (on ``link_base``, default Host's URL), for
        the phone to open. Only a profile that holds everything (``.sswan``, ``.mobileconfig``) can be
        handed off.

        Host gets the profile sealed (:mod:`app.domain.agent.sealed_profile`): AES-256-GCM under a
        random key that is only in the link's fragment (``<base>/ui/handoff#t=<secret>&k=<key>``),
        which a browser never sends to a server. Host can neither read the profile nor change it
        without the phone's page refusing it; its PKCS#12 is, besides, under the passphrase.

        Raises:
            InvalidInput: the profile has files beside it (copy those by hand).
            AgentRejected: Host refused it.
        """
        if report.get("files"):
            raise InvalidInput(f"a {report.get('platform')} profile has files beside it: copy them to the device")
        path = Path(str(report["profile"]))
        media_type = str(report["media_type"])
        key = secrets.token_bytes(KEY_BYTES)
        handoff = Handoff(user_id=self.config.user, host=self.host.id, nonce=secrets.token_bytes(16),
                          timestamp=int(self._clock()), profile_name=path.name, media_type=media_type,
                          profile=seal_profile(key, media_type=media_type, name=path.name, profile=path.read_bytes()),
                          ttl=ttl)
        wire = self.keys.seal(kind=Kind.HANDOFF, to=self.host.id, body=handoff.body(), recipient=self.host_keys.kem,
                              recipient_mlkem=self.host_keys.mlkem)
        answer = self._post(f"{self.host.url}/v1/agent/handoffs", wire).decode("ascii")
        token = answer.removeprefix("/v1/agent/handoffs/")
        if token == answer or _LINK_SECRET.fullmatch(token) is None:
            raise AgentRejected("Host's answer is not a link")
        return f"{(link_base or self.host.url).rstrip('/')}{HANDOFF_PAGE}#t={token}&k={b64e(key)}"

    def devices(self, *, ask: bool = False) -> list[dict[str, Any]]:
        """The devices this user enrolled from here (no passphrase: it was shown once).

        ``ask``: each with what its Target says of it now (through Host, signed by the user):
        ``state`` (``active``, or ``revoked``/``expired``/``closed`` with ``reason``; a profile an
        edit left below its minimums is ``revoked`` with a reason ending "its profile is stale:
        enrol the device again"), or ``state_unknown`` saying why Target could not be asked.
        """
        out = []
        for path in sorted((self.config.state_dir / "devices").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        if ask:
            out = [{**record, **self._device_state(record)} for record in out]
        return out

    def _device_state(self, record: Mapping[str, Any]) -> dict[str, Any]:
        try:
            info = RequestInfo(target=str(record["target"]), ticket=str(record["ticket"]))
            request, wire = self.request(Kind.STATUS, info, int(record["objective_id"]))
            status = self._send(request, wire).status
        except (QossError, GatewayError, KeyError, ValueError) as exc:
            return {"state_unknown": getattr(exc, "message", None) or type(exc).__name__}
        if status is None or status.ticket != record["ticket"]:
            return {"state_unknown": "the target's answer names another ticket"}
        return {"state": status.state.value, **({"reason": status.reason} if status.reason else {})}

    def devices_everywhere(self) -> list[dict[str, Any]]:
        """Every device of this user at every target this client knows, wherever it was enrolled
        from (this machine, the phone's page, another computer), as each Target says: ticket,
        ``target``, platform, ``state`` (``active``, ``stale``, ``revoked``, ``expired``,
        ``ended``), ``reason``, Objective-ID and times (seconds since the epoch). Each target is
        asked through Host with the user's signed ``devices`` request; one that cannot be asked is
        listed as ``{"target": ..., "state_unknown": why}``."""
        out: list[dict[str, Any]] = []
        for target in sorted(self.targets):
            try:
                request, wire = self.request(Kind.DEVICES, RequestInfo(target=target), 3)
                listed = self._send(request, wire).devices or ()
            except (QossError, GatewayError) as exc:
                out.append({"target": target, "state_unknown": exc.message})
                continue
            out += [{"target": target, **d.as_dict()} for d in listed]
        return out

    def revoke_device(self, ticket: str) -> dict[str, Any]:
        """Revoke a device: Target ends its live tunnel and accepts its certificate no more. A
        device enrolled from here is found in this machine's records; any other of this user's
        active devices (say, the phone that joined from its own page) is found by asking the
        targets (:meth:`devices_everywhere`).

        Raises:
            InvalidInput: no device of this user's with that ticket is active anywhere.
            AgentRejected: Target no longer knew it.
        """
        path = self.config.state_dir / "devices" / f"{ticket}.json"
        if not re.fullmatch(r"[0-9a-f]{32}", ticket):
            raise InvalidInput(f"{ticket!r} is not a device's ticket (32 hex digits)")
        if path.is_file():
            record = json.loads(path.read_text())
            self._disconnect_remote(str(record["target"]), ticket, int(record["objective_id"]))
            path.unlink()
            return {"ticket": ticket, "platform": record.get("platform"), "revoked": True}
        found = [d for d in self.devices_everywhere() if d.get("ticket") == ticket and d.get("state") == "active"]
        if not found:
            raise InvalidInput(f"no active device with ticket {ticket} at any target")
        self._disconnect_remote(str(found[0]["target"]), ticket, int(found[0]["objective_id"]))
        return {"ticket": ticket, "platform": found[0]["platform"], "revoked": True}

    # -- local state --------------------------------------------------------------------

    def _path(self, ticket: str) -> Path:
        return self.config.state_dir / f"{ticket}.json"

    def _remember(self, report: Mapping[str, Any], objective_id: int) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(self._path(str(report["ticket"])), json.dumps({**report, "objective_id": objective_id},
                                                                     indent=2))

    def _forget(self, ticket: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(ticket).unlink()

    def _settle(self) -> None:
        """Wait for the last connect's record to be rewritten with its address."""
        rewrite, self._rewrite = self._rewrite, None
        if rewrite is not None:
            try:
                rewrite.result()
            except OSError as exc:  # the record without the address stays: disconnect still works
                log.warning("could not record the virtual IP of the last tunnel: %s", exc.strerror or exc)

    def status(self) -> list[dict[str, Any]]:
        """The tunnels this client brought up, each with ``in_charon``: whether charon has its
        IKE_SA ESTABLISHED with a CHILD_SA INSTALLED now (one ``list-sas``).

        A tunnel of which charon has no IKE_SA at all was closed from the other side (Target
        revoked the user, the ticket expired, an edit left its suite below the objective's
        minimums, or charon restarted): it is cleaned up here, its
        conn and secret unloaded and its record forgotten, and reported once with ``closed``
        saying why. One whose IKE_SA exists but is not up (connecting, rekeying) is left as it is.
        """
        known = self.tunnels()
        if not known:
            return []
        sas = {sa.name: sa for sa in self.vici.list_sas()}
        out: list[dict[str, Any]] = []
        for t in known:
            sa = sas.get(str(t.get("conn")))
            if sa is not None:
                up = sa.state == "ESTABLISHED" and any(c.state == "INSTALLED" for c in sa.children)
                out.append({**t, "in_charon": up})
                continue
            self._teardown(str(t["conn"]), ppk=_has_ppk(t))
            self._forget(str(t["ticket"]))
            out.append({**t, "in_charon": False,
                        "closed": "charon has no IKE_SA for it: closed by the target (the ticket expired, the "
                                  "user was revoked, or an edit of the ratings or policies left its suite below "
                                  "the objective's minimums) or charon restarted; its conn and secret were "
                                  "unloaded: connect again"})
        return out

    def tunnels(self) -> list[dict[str, Any]]:
        """The tunnels this client brought up and has not torn down (from ``state_dir``)."""
        self._settle()
        if not self.config.state_dir.is_dir():
            return []
        out = []
        for path in sorted(self.config.state_dir.glob("*.json")):
            if path.name == _CAPS_FILE:
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        return out


def _has_ppk(record: Mapping[str, Any]) -> bool:
    """Whether a tunnel this client keeps has a post-quantum preshared key (its suite's mechanism)."""
    return (record.get("suite") or {}).get("post_quantum") == "ppk"
