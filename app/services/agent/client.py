"""The agent's Client role (Liu et al. §2.2 steps 1 and 6): ask, verify the answer, bring the tunnel up.

``connect`` signs a request with the user's Ed25519 key and seals it to Host, then
opens Target's answer with the user's X25519 key and checks it: Target's signature,
that it answers *this* request (request id), is for this user via this host, and is
fresh. Only then does it load the session key and the conn into the local charon,
initiate, and check with ``list-sas`` that charon negotiated exactly the suite Target
chose, all in one pipelined VICI exchange; the virtual IP comes from Target's pool.
What the client remembers of a tunnel (ticket, conn, suite, virtual IP, expiry; never
the key) is a file in ``state_dir`` (:mod:`~app.services.agent.client_state`).
Any failure after Target configured its side asks Target (through Host) to close it.

What the local charon can do is read and cached by :mod:`~app.services.agent.client_capabilities`;
the user's phones and laptops are enrolled, handed off and revoked by
:mod:`~app.services.agent.client_devices`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from app.domain.agent import (
    AgentRejected,
    ClientRequest,
    Kind,
    RequestInfo,
    Response,
    TunnelingInfo,
    agent_conn_name,
    check_fresh,
    client_conn,
    sealed_hybrid,
)
from app.domain.agent.conns import ppk_name
from app.domain.agent.ports import AgentCrypto, AgentKeys, PeerKeys, Post
from app.domain.charon_port import (
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
from app.domain.errors import GatewayError, InvalidInput, TunnelVerificationFailed
from app.domain.tunnels import expected_sa, mismatches
from app.services import tunnel_setup
from app.services.agent.client_capabilities import CharonCapabilities
from app.services.agent.client_devices import ClientDevices
from app.services.agent.client_state import TunnelRecords, has_ppk
from app.services.agent.config import ClientConfig
from app.services.agent.timing import Steps
from app.services.tunnel_setup import INITIATE_TIMEOUT_MS, came_up, observed_sa

__all__ = ["AgentClient"]

log = logging.getLogger("qoss.agent.client")


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
        self._capabilities = CharonCapabilities(vici=vici, socket=config.vici_socket, state_dir=config.state_dir,
                                                clock=clock)
        self._records = TunnelRecords(config.state_dir)
        self._devices = ClientDevices(config=config, clock=clock, ask=self._ask, hand=self._hand_to_host)
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
        return request, self._seal_to_host(kind, request.body())

    def _seal_to_host(self, kind: Kind, body: bytes) -> bytes:
        """``body`` as a message of ``kind``, signed by the user and sealed to Host."""
        return self.keys.seal(kind=kind, to=self.host.id, body=body, recipient=self.host_keys.kem,
                              recipient_mlkem=self.host_keys.mlkem)

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

    def _to_host(self, path: str, wire: bytes) -> bytes:
        """Post ``wire`` to ``path`` at Host: its answer."""
        return self._post(f"{self.host.url}{path}", wire)

    def _hand_to_host(self, path: str, kind: Kind, body: bytes) -> bytes:
        """``body`` as a message of ``kind``, signed and sealed to Host, posted to ``path`` at Host: its answer."""
        return self._to_host(path, self._seal_to_host(kind, body))

    def _send(self, request: ClientRequest, wire: bytes) -> Response:
        return self.accept(self._to_host("/v1/agent/requests", wire), request)

    def _ask(self, kind: Kind, info: RequestInfo, objective_id: int) -> Response:
        """Send a request of ``kind`` to Target through Host: Target's answer, checked (:meth:`accept`)."""
        request, wire = self.request(kind, info, objective_id)
        return self._send(request, wire)

    # -- connect / disconnect ------------------------------------------------------------------

    def capabilities(self, *, refresh: bool = False) -> tuple[tuple[str, ...], bool]:
        """(algorithm keywords of the local charon, whether it can do AH and transport mode).

        Read with VICI ``get-algorithms`` and ``stats``, then cached in memory and in
        ``state_dir/capabilities.json``, keyed on the charon: a restarted charon is read again, and
        so is one read more than :data:`~app.services.agent.client_capabilities.CAPABILITIES_TTL`
        seconds ago or when ``refresh`` is true (``qoss agent connect --refresh``)
        (:class:`~app.services.agent.client_capabilities.CharonCapabilities`).
        """
        return self._capabilities.read(refresh=refresh)

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
        answer = self._to_host("/v1/agent/requests", wire)
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
            self._rewrite = self._loader.submit(self._records.remember, dict(report), objective_id)
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
                        self._records.remember(report, objective_id)
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
                self._records.forget(tunnel.ticket)
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
        self._ask(Kind.DISCONNECT, RequestInfo(target=target, ticket=ticket), objective_id)

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
            self._teardown(t["conn"], ppk=has_ppk(t))
            try:
                self._disconnect_remote(t["target"], t["ticket"], int(t["objective_id"]))
            except AgentRejected:
                log.info("target no longer knew ticket %s (expired or revoked)", t["ticket"])
            self._records.forget(t["ticket"])
            closed.append(t["ticket"])
        return closed

    # -- devices ------------------------------------------------------------------------

    def enrol_device(self, *, target: str, objective_id: int, platform: str, out_dir: Path,
                     min_levels: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Enrol a phone or laptop: its credential and profile written into ``out_dir``, and the
        report with the one-time passphrase (:meth:`ClientDevices.enrol
        <app.services.agent.client_devices.ClientDevices.enrol>`)."""
        return self._devices.enrol(target=target, objective_id=objective_id, platform=platform, out_dir=out_dir,
                                   min_levels=min_levels)

    def handoff(self, report: Mapping[str, Any], *, ttl: int = 600, link_base: str | None = None) -> str:
        """Leave a device's profile at Host for one download by the phone: the link
        (:meth:`ClientDevices.handoff <app.services.agent.client_devices.ClientDevices.handoff>`)."""
        return self._devices.handoff(report, ttl=ttl, link_base=link_base)

    def devices(self, *, ask: bool = False) -> list[dict[str, Any]]:
        """The devices this user enrolled from here; ``ask``: each with what its Target says of it now
        (:meth:`ClientDevices.listed <app.services.agent.client_devices.ClientDevices.listed>`)."""
        return self._devices.listed(ask=ask)

    def devices_everywhere(self) -> list[dict[str, Any]]:
        """Every device of this user at every target this client knows, as each Target says
        (:meth:`ClientDevices.everywhere <app.services.agent.client_devices.ClientDevices.everywhere>`)."""
        return self._devices.everywhere()

    def revoke_device(self, ticket: str) -> dict[str, Any]:
        """Revoke a device at its Target
        (:meth:`ClientDevices.revoke <app.services.agent.client_devices.ClientDevices.revoke>`)."""
        return self._devices.revoke(ticket)

    # -- local state --------------------------------------------------------------------

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
            self._teardown(str(t["conn"]), ppk=has_ppk(t))
            self._records.forget(str(t["ticket"]))
            out.append({**t, "in_charon": False,
                        "closed": "charon has no IKE_SA for it: closed by the target (the ticket expired, the "
                                  "user was revoked, or an edit of the ratings or policies left its suite below "
                                  "the objective's minimums) or charon restarted; its conn and secret were "
                                  "unloaded: connect again"})
        return out

    def tunnels(self) -> list[dict[str, Any]]:
        """The tunnels this client brought up and has not torn down (from ``state_dir``)."""
        self._settle()
        return self._records.all()
