"""Target's kit for devices (:class:`~app.domain.agent.ports.DeviceKit`): its device CA in the
agent's key directory, the profile writers of :mod:`app.adapters.agent.profiles`, and the key that
seals the devices' PPKs for their sessions (``device-ppk.key`` beside the CA's key, 32 random bytes,
0600, made on first use: AES-256-GCM, each PPK under a fresh nonce, bound to its session)."""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.adapters.agent.ca_files import DeviceCAError, create_file, open_directory, read_file
from app.adapters.agent.device_ca import DeviceCA
from app.adapters.agent.profiles import DeviceProfileInput, write_profile
from app.domain.agent.ports import DeviceProfileRequest, IssuedDevice

__all__ = ["PPK_KEY_FILE", "LocalDeviceKit"]

log = logging.getLogger(__name__)

#: The file of the key that seals the devices' PPKs, in the CA's directory.
PPK_KEY_FILE = "device-ppk.key"
_PPK_SEAL = b"qoss-device-ppk/1 "


class LocalDeviceKit:
    """The CA of Target ``owner``, kept in ``key_dir`` (made on first use). ``owner`` is also the
    gateway's IKE identity: a new CA permits it and ``gateway_addresses`` (the addresses devices
    reach the gateway at) and the device names, nothing else."""

    def __init__(self, key_dir: Path, *, owner: str, gateway_addresses: Sequence[str] = ()) -> None:
        self._dir = Path(key_dir)
        self._owner = owner
        self._gateway = (owner, *gateway_addresses)
        self._ca: DeviceCA | None = None
        self._ppk_key: bytes | None = None
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
            remote_ts=profile.remote_ts, domains=profile.domains, device_cert_der=credential.cert_der,
            ppk=profile.ppk, ppk_id=profile.ppk_id))
        return IssuedDevice(profile_name=written.filename, media_type=written.media_type, profile=written.content,
                            files=dict(written.files), passphrase=credential.passphrase,
                            not_after=credential.not_after)

    def seal_ppk(self, ppk: bytes, *, context: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = AESGCM(self._sealing_key()).encrypt(nonce, ppk, _PPK_SEAL + context.encode("utf-8"))
        return base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open_ppk(self, sealed: str, *, context: str) -> bytes:
        try:
            data = base64.urlsafe_b64decode(sealed.encode("ascii"))
            return AESGCM(self._sealing_key()).decrypt(data[:12], data[12:], _PPK_SEAL + context.encode("utf-8"))
        except (InvalidTag, ValueError, binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError(f"the sealed PPK of {context[:80]} does not open with this Target's key") from exc

    def _sealing_key(self) -> bytes:
        """The PPK sealing key: read from the CA's directory, made there (0600) if missing."""
        with self._lock:
            if self._ppk_key is None:
                with open_directory(self._dir) as dfd:
                    found = read_file(dfd, self._dir, PPK_KEY_FILE, secret=True)
                    if found is None:
                        create_file(dfd, PPK_KEY_FILE, secrets.token_bytes(32), mode=0o600)
                        found = read_file(dfd, self._dir, PPK_KEY_FILE, secret=True)
                if found is None or len(found.data) != 32:
                    raise DeviceCAError(f"{self._dir / PPK_KEY_FILE} is not a 32-byte key: remove it (the "
                                        "devices enrolled with a PPK then need enrolling again)")
                self._ppk_key = found.data
            return self._ppk_key
