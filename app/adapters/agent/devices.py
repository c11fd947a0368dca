"""Target's kit for devices (:class:`~app.domain.agent.ports.DeviceKit`): its device CA in the
agent's key directory and the profile writers of :mod:`app.adapters.agent.profiles`."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from app.adapters.agent.device_ca import DeviceCA
from app.adapters.agent.profiles import DeviceProfileInput, write_profile
from app.domain.agent.ports import DeviceProfileRequest, IssuedDevice

__all__ = ["LocalDeviceKit"]

log = logging.getLogger(__name__)


class LocalDeviceKit:
    """The CA of Target ``owner``, kept in ``key_dir`` (made on first use). ``owner`` is also the
    gateway's IKE identity: a new CA permits it and ``gateway_addresses`` (the addresses devices
    reach the gateway at) and the device names, nothing else."""

    def __init__(self, key_dir: Path, *, owner: str, gateway_addresses: Sequence[str] = ()) -> None:
        self._dir = Path(key_dir)
        self._owner = owner
        self._gateway = (owner, *gateway_addresses)
        self._ca: DeviceCA | None = None
        self._lock = threading.Lock()

    def _authority(self) -> DeviceCA:
        with self._lock:
            if self._ca is None:
                self._ca = DeviceCA.load_or_create(self._dir, owner=self._owner, gateway=self._gateway)
                if not self._ca.constrained:
                    log.warning("the device CA in %s has no name constraints: whoever gets its key can make "
                                "certificates every enrolled device trusts; replace it (docs/agent.md, "
                                "\"Rotating the device CA\")", self._dir)
            return self._ca

    def ca_cert(self) -> bytes:
        return self._authority().cert_der

    def gateway(self, identity: str, addresses: Sequence[str]) -> tuple[bytes, bytes]:
        credential = self._authority().gateway(identity=identity, addresses=addresses)
        return credential.cert_der, credential.key_der

    def ike_identity(self, identity: str, platform: str) -> str:
        # Apple's client sends an FQDN (the certificate's subjectAltName); the others the subject DN.
        return identity if platform == "apple" else DeviceCA.subject_dn(identity)

    def issue(self, identity: str, lifetime: int, profile: DeviceProfileRequest) -> IssuedDevice:
        credential = self._authority().issue_device(identity=identity, lifetime=lifetime, name=profile.name,
                                                    legacy=profile.platform == "apple")
        stem = identity.replace(".", "-")
        written = write_profile(DeviceProfileInput(
            name=profile.name, uuid=str(uuid.uuid4()), platform=profile.platform,
            remote_address=profile.remote_address, remote_id=profile.remote_id, local_id=profile.local_id,
            ca_cert_der=self.ca_cert(), p12=credential.p12, p12_name=f"{stem}.p12",
            ike_proposal=profile.ike_proposal, esp_proposal=profile.esp_proposal,
            ike_lifetime=profile.ike_lifetime, child_lifetime=profile.child_lifetime,
            remote_ts=profile.remote_ts, domains=profile.domains, device_cert_der=credential.cert_der))
        return IssuedDevice(profile_name=written.filename, media_type=written.media_type, profile=written.content,
                            files=dict(written.files), passphrase=credential.passphrase,
                            not_after=credential.not_after)
