"""Device enrolment at Target: a phone's or laptop's own VPN client joins with a certificate and
a profile instead of the agent.

A device asks through its user's Host as a client does, naming its platform. Target checks the
platform can take what is asked (an IPsec tunnel, the post-quantum mechanism negotiated), issues
the device's certificate and its platform's profile before charon is touched (a platform that
cannot express the suite is refused with nothing loaded), and loads the CA as a trust anchor,
the gateway's key and a conn that accepts only that device's certificate (and with a PPK, that
PPK only). The PPK is kept sealed with the session, so that the device's conn can be loaded again
when charon restarts. A user's devices are listed, newest first, from Target's own sessions.
"""

from __future__ import annotations

import logging

from app.domain.agent import AgentSessionState, DeviceBundle, device_conn
from app.domain.agent.parts import MAX_DEVICES_LISTED, DeviceInfo, device_state
from app.domain.agent.platforms import LABELS, PLATFORMS, post_quantum_refusal
from app.domain.agent.ports import AgentSession, AgentStore, DeviceKit, DeviceProfileRequest, IssuedDevice
from app.domain.charon_port import CharonCommand, LoadCert, LoadConn, LoadKey, LoadShared
from app.domain.errors import GatewayError, InvalidInput, PlatformCannot
from app.domain.negotiation import NegotiationResult
from app.services.agent.config import TargetRole
from app.services.agent.target_charon import TargetCharon
from app.services.agent.target_loads import SessionLoads, fresh_ppk

__all__ = ["TargetDevices", "devices_of"]

log = logging.getLogger("qoss.agent.target")


def devices_of(store: AgentStore, *, user_id: str, host_id: str) -> tuple[DeviceInfo, ...]:
    """``user_id``'s (of ``host_id``) device enrolments at this Target (its sessions with a
    platform), newest first (at most :data:`~app.domain.agent.parts.MAX_DEVICES_LISTED`)."""
    with store.unit() as uow:
        rows = uow.sessions.select(user_id=user_id, limit=1000)
    out: list[DeviceInfo] = []
    for r in rows:
        if r.platform is None or r.host_id != host_id:
            continue
        active = r.state == AgentSessionState.ACTIVE.value
        out.append(DeviceInfo(
            ticket=r.ticket, platform=r.platform, state=device_state(AgentSessionState(r.state), r.reason),
            reason=r.reason[:500], objective_id=r.objective_id, created=int(r.created_at.timestamp()),
            expires=int(r.expires_at.timestamp()),
            ended=None if active else int((r.updated_at or r.created_at).timestamp())))
    return tuple(out[:MAX_DEVICES_LISTED])


def _ppk_context(ticket: str, ppk_id: str) -> str:
    """What a device's sealed PPK is bound to: its session and its PPK id."""
    return f"{ticket} {ppk_id}"


class TargetDevices:
    """The devices of one Target.

    Args:
        kit: Target's CA for devices and its profile writers (None: it enrols no devices).
        role: Target's configuration; ``identity``: its IKE identity.
        charon: Target's charon (a device's conn is loaded again into it after a restart).
        loads: what charon loads for a session (pools and their names).
    """

    def __init__(self, *, kit: DeviceKit | None, role: TargetRole, identity: str, charon: TargetCharon,
                 loads: SessionLoads) -> None:
        self._kit = kit
        self._role = role
        self._identity = identity
        self._charon = charon
        self._loads = loads

    def check_platform(self, platform: str, objective_id: int, post_quantum: int) -> None:
        """A device of ``platform`` may ask for ``objective_id`` with a post-quantum minimum of
        ``post_quantum`` here.

        Raises:
            InvalidInput: this Target enrols no devices, the platform is unknown, or the objective
                is Native (no tunnel).
            PlatformCannot: the platform's client cannot meet the post-quantum minimum.
        """
        if self._kit is None:
            raise InvalidInput("this Target enrols no devices")
        if platform not in PLATFORMS:
            raise InvalidInput(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")
        if objective_id == 1:
            raise InvalidInput("a device profile is an IPsec tunnel: objective 1 (Native) has none")
        cannot = post_quantum_refusal(platform, post_quantum)
        if cannot is not None:
            raise PlatformCannot(cannot)

    def new_ppk(self, ticket: str, platform: str, result: NegotiationResult) -> tuple[str, bytes, str] | None:
        """A device's PPK when its negotiation chose one (a post-quantum minimum above 0): its id,
        32 random bytes, and the PPK sealed for its session; None when none was asked for.

        Raises:
            PlatformCannot: the negotiation chose a post-quantum mechanism the platform's client
                cannot take from a profile.
        """
        mechanism = result.suite.post_quantum
        if mechanism is None:
            return None
        if mechanism not in PLATFORMS[platform].post_quantum:
            raise PlatformCannot(f"{LABELS[platform]} ({platform}) cannot take {mechanism} from a profile: "
                                 f"{PLATFORMS[platform].post_quantum_note}")
        assert self._kit is not None
        ppk_id, ppk = fresh_ppk()
        return ppk_id, ppk, self._kit.seal_ppk(ppk, context=_ppk_context(ticket, ppk_id))

    def issue(self, conn: str, platform: str, client_identity: str, ike: str, esp: str,
              result: NegotiationResult, lifetime: int,
              ppk: tuple[str, bytes] | None) -> tuple[IssuedDevice, list[CharonCommand]]:
        """The device's credential and profile, and what Target's charon loads for it: the CA as a
        trust anchor, the gateway's key, the conn that accepts this device's certificate only (and
        with ``ppk``, its id and key, that PPK only)."""
        kit, role = self._kit, self._role
        assert kit is not None
        subject = kit.ike_identity(client_identity, platform)
        # A platform that cannot say this suite in its own names raises PlatformCannot (its
        # Inexpressible): no credential leaves Target then.
        issued = kit.issue(client_identity, lifetime, DeviceProfileRequest(
            platform=platform, name=f"qoss {self._identity}", remote_address=role.ike_address,
            remote_id=self._identity, local_id=subject, ike_proposal=ike, esp_proposal=esp,
            ike_lifetime=result.lifetimes["ike"], child_lifetime=result.lifetimes["child"],
            remote_ts=tuple(role.protected), domains=tuple(role.domains),
            ppk=ppk[1] if ppk is not None else None, ppk_id=ppk[0] if ppk is not None else None))
        return issued, self._charon_loads(conn, subject, ike, esp, result.mode, result.lifetimes, ppk)

    def _charon_loads(self, conn: str, subject: str, ike: str, esp: str, mode: str,
                      lifetimes: dict[str, int], ppk: tuple[str, bytes] | None = None) -> list[CharonCommand]:
        """What Target's charon loads for one device: the CA as a trust anchor, the gateway's key,
        the conn that accepts only that device's certificate with the negotiated proposals; with
        ``ppk`` (its id and key), the PPK as a shared secret named as the conn and the conn requiring it."""
        kit, role = self._kit, self._role
        assert kit is not None
        ca = kit.ca_cert()
        gateway_cert, gateway_key = kit.gateway(self._identity, [role.ike_address])
        body = device_conn(
            name=conn, target_address=role.ike_address, target_identity=self._identity,
            device_identity=subject, local_ts=role.protected, pool=conn, ike_proposal=ike,
            esp_proposal=esp, mode=mode, ike_lifetime=lifetimes["ike"], child_lifetime=lifetimes["child"],
            gateway_cert=gateway_cert, ca_cert=ca, pool6=self._loads.pool6(conn),
            ppk_id=ppk[0] if ppk is not None else None)
        shared: list[CharonCommand] = [LoadShared(conn, ppk[1], (ppk[0],), "PPK")] if ppk is not None else []
        return [LoadCert(ca, ca=True), LoadKey(gateway_key), *shared, LoadConn(conn, body)]

    def restore(self, session: AgentSession) -> bool:
        """Load an enrolled device's conn and pool again (charon restarted): True if charon took them."""
        suite, platform = session.suite, session.platform
        proposals, lifetimes, vip = suite.get("proposals") or {}, suite.get("lifetimes"), session.virtual_ip
        if (self._kit is None or platform is None or vip is None or not lifetimes
                or not proposals.get("ike") or not proposals.get("esp")):
            return False
        try:
            loads = self._charon_loads(session.conn, self._kit.ike_identity(session.client_identity, platform),
                                       proposals["ike"], proposals["esp"], suite.get("mode", "tunnel"),
                                       dict(lifetimes), self._stored_ppk(session))
            replies = self._charon.gateway().batch([*loads, *self._loads.pools(session.conn, vip)[1]])
        except (GatewayError, ValueError, OSError) as exc:
            log.warning("device %s not loaded again: %s", session.ticket, getattr(exc, "message", exc))
            return False
        failed = [r for r in replies if isinstance(r, GatewayError)]
        if failed:
            log.warning("device %s not loaded again: %s", session.ticket, failed[0].message)
            self._charon.unload(self._charon.gateway(), session.conn,
                                ["conn", *self._loads.pools(session.conn, vip)[0]])
            return False
        log.info("device %s of %s loaded again into charon", session.ticket, session.user_id)
        return True

    def _stored_ppk(self, session: AgentSession) -> tuple[str, bytes] | None:
        """The PPK an enrolled device's session keeps sealed (its id and key), or None if it has none.

        Raises:
            ValueError: the sealed PPK does not open with this Target's key.
        """
        kept = session.suite.get("ppk")
        if not kept or self._kit is None:
            return None
        ppk_id = str(kept["id"])
        return ppk_id, self._kit.open_ppk(str(kept["sealed"]), context=_ppk_context(session.ticket, ppk_id))

    def bundle(self, platform: str | None, device: IssuedDevice | None) -> DeviceBundle | None:
        """What the answer carries to the device's user: its profile, the files beside it, the
        PKCS#12's one-time passphrase and the CA certificate (None: no device)."""
        if platform is None or device is None or self._kit is None:
            return None
        return DeviceBundle(platform=platform, profile_name=device.profile_name, media_type=device.media_type,
                            profile=device.profile, files=dict(device.files), passphrase=device.passphrase,
                            ca_cert=self._kit.ca_cert(), not_after=int(device.not_after.timestamp()))
