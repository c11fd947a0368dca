"""A user's phones and laptops, from the client: enrolment, hand-off and revocation.

A device's own VPN client joins with a certificate and a profile instead of the agent. The
client asks Target for them (through Host, as for a tunnel), writes them where the user can
copy them (files 0600) and keeps a record of the enrolment (never the PKCS#12's passphrase:
it is shown once). A profile that holds everything can instead be left at Host for one download
by the phone, sealed under a key that only the link's fragment carries (:func:`seal_profile`).
The user's devices are listed from this machine's records or as each Target says, wherever
they were enrolled from, and revoked at their Target.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.domain.agent import AgentRejected, Handoff, Kind, RequestInfo, Response, b64e
from app.domain.agent.sealed_profile import KEY_BYTES, NONCE_BYTES, header
from app.domain.errors import GatewayError, InvalidInput, QossError
from app.services.agent.client_state import write_private
from app.services.agent.config import ClientConfig

__all__ = ["HANDOFF_PAGE", "ClientDevices", "ca_fingerprint", "seal_profile"]

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


class ClientDevices:
    """One user's devices, as their client sees and manages them.

    Args:
        config: the client's configuration (the user, Host, the targets it knows, ``state_dir``).
        ask: sends a signed request to Target through Host and returns Target's checked answer.
        hand: signs a message of a kind, seals it to Host and posts it to a path of Host's: Host's answer.
    """

    def __init__(self, *, config: ClientConfig, clock: Callable[[], float],
                 ask: Callable[[Kind, RequestInfo, int], Response], hand: Callable[[str, Kind, bytes], bytes]) -> None:
        self._config = config
        self._clock = clock
        self._ask = ask
        self._hand = hand

    def _records(self) -> Path:
        return self._config.state_dir / "devices"

    def _revoke_at(self, target: str, ticket: str, objective_id: int) -> None:
        self._ask(Kind.DISCONNECT, RequestInfo(target=target, ticket=ticket), objective_id)

    def enrol(self, *, target: str, objective_id: int, platform: str, out_dir: Path,
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
        response = self._ask(Kind.CONNECT, info, objective_id)
        device, tunnel = response.device, response.tunneling_info
        if device is None or tunnel is None or device.platform != platform:
            raise AgentRejected("the answer carries no profile for this platform")
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        written = {}
        for name, data in {device.profile_name: device.profile, **device.files}.items():
            path = out_dir / name  # names are checked when the answer is parsed: no folders, no dot files
            write_private(path, data)
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
        devices = self._records()
        devices.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(devices / f"{tunnel.ticket}.json", json.dumps({**record, "objective_id": objective_id},
                                                                     indent=2))
        return report

    def handoff(self, report: Mapping[str, Any], *, ttl: int = 600, link_base: str | None = None) -> str:
        """Leave the profile of a device just enrolled (``report`` from :meth:`enrol`) at Host
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
        host = self._config.host_ref
        handoff = Handoff(user_id=self._config.user, host=host.id, nonce=secrets.token_bytes(16),
                          timestamp=int(self._clock()), profile_name=path.name, media_type=media_type,
                          profile=seal_profile(key, media_type=media_type, name=path.name, profile=path.read_bytes()),
                          ttl=ttl)
        answer = self._hand("/v1/agent/handoffs", Kind.HANDOFF, handoff.body()).decode("ascii")
        token = answer.removeprefix("/v1/agent/handoffs/")
        if token == answer or _LINK_SECRET.fullmatch(token) is None:
            raise AgentRejected("Host's answer is not a link")
        return f"{(link_base or host.url).rstrip('/')}{HANDOFF_PAGE}#t={token}&k={b64e(key)}"

    def listed(self, *, ask: bool = False) -> list[dict[str, Any]]:
        """The devices this user enrolled from here (no passphrase: it was shown once).

        ``ask``: each with what its Target says of it now (through Host, signed by the user):
        ``state`` (``active``, or ``revoked``/``expired``/``closed`` with ``reason``; a profile an
        edit left below its minimums is ``revoked`` with a reason ending "its profile is stale:
        enrol the device again"), or ``state_unknown`` saying why Target could not be asked.
        """
        out = []
        for path in sorted(self._records().glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(path.read_text()))
        if ask:
            out = [{**record, **self._state(record)} for record in out]
        return out

    def _state(self, record: Mapping[str, Any]) -> dict[str, Any]:
        try:
            info = RequestInfo(target=str(record["target"]), ticket=str(record["ticket"]))
            status = self._ask(Kind.STATUS, info, int(record["objective_id"])).status
        except (QossError, GatewayError, KeyError, ValueError) as exc:
            return {"state_unknown": getattr(exc, "message", None) or type(exc).__name__}
        if status is None or status.ticket != record["ticket"]:
            return {"state_unknown": "the target's answer names another ticket"}
        return {"state": status.state.value, **({"reason": status.reason} if status.reason else {})}

    def everywhere(self) -> list[dict[str, Any]]:
        """Every device of this user at every target this client knows, wherever it was enrolled
        from (this machine, the phone's page, another computer), as each Target says: ticket,
        ``target``, platform, ``state`` (``active``, ``stale``, ``revoked``, ``expired``,
        ``ended``), ``reason``, Objective-ID and times (seconds since the epoch). Each target is
        asked through Host with the user's signed ``devices`` request; one that cannot be asked is
        listed as ``{"target": ..., "state_unknown": why}``."""
        out: list[dict[str, Any]] = []
        for target in sorted(self._config.targets):
            try:
                listed = self._ask(Kind.DEVICES, RequestInfo(target=target), 3).devices or ()
            except (QossError, GatewayError) as exc:
                out.append({"target": target, "state_unknown": exc.message})
                continue
            out += [{"target": target, **d.as_dict()} for d in listed]
        return out

    def revoke(self, ticket: str) -> dict[str, Any]:
        """Revoke a device: Target ends its live tunnel and accepts its certificate no more. A
        device enrolled from here is found in this machine's records; any other of this user's
        active devices (say, the phone that joined from its own page) is found by asking the
        targets (:meth:`everywhere`).

        Raises:
            InvalidInput: no device of this user's with that ticket is active anywhere.
            AgentRejected: Target no longer knew it.
        """
        path = self._records() / f"{ticket}.json"
        if not re.fullmatch(r"[0-9a-f]{32}", ticket):
            raise InvalidInput(f"{ticket!r} is not a device's ticket (32 hex digits)")
        if path.is_file():
            record = json.loads(path.read_text())
            self._revoke_at(str(record["target"]), ticket, int(record["objective_id"]))
            path.unlink()
            return {"ticket": ticket, "platform": record.get("platform"), "revoked": True}
        found = [d for d in self.everywhere() if d.get("ticket") == ticket and d.get("state") == "active"]
        if not found:
            raise InvalidInput(f"no active device with ticket {ticket} at any target")
        self._revoke_at(str(found[0]["target"]), ticket, int(found[0]["objective_id"]))
        return {"ticket": ticket, "platform": found[0]["platform"], "revoked": True}
