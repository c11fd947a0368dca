"""A Target's own CA: the gateway's certificate and short-lived device credentials.

Phones and laptops with stock IKEv2 clients (the strongSwan app, Apple, Windows,
NetworkManager, charon-cmd) authenticate to a Target's charon with a certificate this CA
issued. The CA is one ECDSA P-256 key and its self-signed certificate, kept in a directory of
the Target's: ``device-ca.key`` (0600) and ``device-ca.crt`` (0644), beside the gateway's own
``device-gateway.key`` (0600) and ``device-gateway.crt``. A device's private key never touches
the disk: it leaves only inside the PKCS#12 file handed out, encrypted with a one-time
passphrase that is shown once and never kept.

Devices install the CA as a trust anchor, so the CA vouches for as little as IKE needs: its
certificate carries name constraints (DNS names under
:data:`~app.domain.agent.conns.DEVICE_NAMESPACE` and the gateway's own names and addresses,
nothing else) and an extended key usage that limits every certificate below it to TLS
server/client authentication and the IKE purposes. Whoever holds its key can still mint a
certificate only for the gateway's own names or for a device name that resolves nowhere, and no
code-signing or e-mail certificate. A CA made before it carried these limits is still loaded
(:attr:`DeviceCA.constrained` is False): enrolled devices keep working until it is replaced
(docs/agent.md, "Rotating the device CA").

Every file is opened relative to the open directory, without following links; a key file
anyone else may read or write is refused, never used. The first process to make the CA wins
(the key is created with ``O_CREAT|O_EXCL``, the certificate written whole and renamed into
place); any other process making it at the same moment loads the winner's. The gateway's
files are renewed under a lock on the directory, so two processes never mix their halves.

Errors::

    DeviceCAError (ValueError)    a file that cannot be used: a link, open to others, not ours,
                                  a key that does not match its certificate, another owner's CA
    InvalidInput (ValueError)     an owner, identity, address, name or lifetime that cannot be
                                  used (app.domain.errors)
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from app.adapters.agent import ca_certificates as certs
from app.adapters.agent.ca_files import DeviceCAError, create_file, open_directory, read_file, replace_file
from app.domain.agent.conns import DEVICE_NAMESPACE
from app.domain.errors import InvalidInput

__all__ = ["DeviceCA", "DeviceCAError", "DeviceCredential", "GatewayCredential"]

CA_KEY = "device-ca.key"
CA_CERT = "device-ca.crt"
GATEWAY_KEY = "device-gateway.key"
GATEWAY_CERT = "device-gateway.crt"

#: The "IP security IKE intermediate" purpose (RFC 4945 names it; Windows and macOS want it).
IKE_INTERMEDIATE = ObjectIdentifier("1.3.6.1.5.5.8.2.2")
#: What the CA may vouch for, as an extended key usage in the CA certificate itself. RFC 5280
#: defines the extension for end entities; Windows (its "EKU chaining"), Apple's trust evaluation
#: and OpenSSL read it in a CA as the purposes every certificate below may have. TLS server and
#: client authentication (Windows' IKEv2 client wants serverAuth in the gateway's certificate),
#: ipsecIKE (RFC 4945) and IKE intermediate: no code signing, e-mail, time stamping or OCSP.
CA_PURPOSES = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.IPSEC_IKE,
               IKE_INTERMEDIATE)

_CA_LIFETIME = timedelta(days=3653)  # ten years, leap days included
_GATEWAY_LIFETIME = timedelta(days=365)
_GATEWAY_RENEW = timedelta(days=30)  # a gateway certificate with less left is made again
_BACKDATE = timedelta(minutes=5)  # a device whose clock runs a little behind still accepts a fresh certificate
_DEVICE_LIFETIME = range(3600, 90 * 86400 + 1)  # seconds: an hour to 90 days

#: PBKDF2 rounds of the PKCS#12 encryption. The passphrase carries 120 bits, so the rounds are a
#: margin, not the defence; kept modest so a phone opens the file at once.
_KDF_ROUNDS = 100_000

#: How long a CA key file may stay incomplete (no certificate yet) before it counts as the
#: leftover of a creation that died rather than one still under way in another process.
_SETTLE = 5.0
_POLL = 0.02


def _utc_now() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True, slots=True)
class DeviceCredential:
    """What a device is handed once: its PKCS#12 file and the passphrase that opens it.

    Attributes:
        p12: PKCS#12 with the device's key, its certificate and the CA certificate, encrypted
            with ``passphrase`` (PBES2, AES-256-CBC, HMAC-SHA256).
        passphrase: the one-time passphrase (``xxxx-xxxx-xxxx-xxxx-xxxx-xxxx``): show it once,
            never store it.
        cert_der: the device certificate (DER).
        serial: its serial number.
        not_after: when it expires (aware, UTC).
    """

    p12: bytes
    passphrase: str
    cert_der: bytes
    serial: int
    not_after: datetime

    def __repr__(self) -> str:
        return f"DeviceCredential(serial={self.serial:#x}, not_after={self.not_after.isoformat()})"


@dataclass(frozen=True, slots=True)
class GatewayCredential:
    """The gateway's certificate and private key, for charon (``load-cert``, ``load-key``).

    Attributes:
        cert_der: the gateway certificate (DER).
        key_der: its private key, PKCS#8 DER.
        key_type: the key's type as VICI's ``load-key`` names it (``"ecdsa"``).
    """

    cert_der: bytes
    key_der: bytes
    key_type: str

    def __repr__(self) -> str:
        try:
            subject = x509.load_der_x509_certificate(self.cert_der).subject.rfc4514_string()
        except ValueError:
            subject = "?"
        return f"GatewayCredential(subject={subject!r}, key_type={self.key_type!r})"


# --------------------------------------------------------------------------- the CA


class DeviceCA:
    """One Target's CA, loaded from (or made in) its directory by :meth:`load_or_create`.

    Holds the CA's private key in memory; never printed.
    """

    __slots__ = ("_cert", "_clock", "_directory", "_key")

    def __init__(self, *, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate,
                 clock: Callable[[], datetime]) -> None:
        self._directory = directory
        self._key = key
        self._cert = cert
        self._clock = clock

    def __repr__(self) -> str:
        return f"DeviceCA({self.common_name!r}, directory={str(self._directory)!r})"

    @classmethod
    def load_or_create(cls, directory: Path, *, owner: str, gateway: Sequence[str] = (),
                       clock: Callable[[], datetime] = _utc_now) -> DeviceCA:
        """The CA of Target ``owner`` kept in ``directory``, made there on first use.

        The CA is ECDSA P-256, self-signed, ``CN=qoss <owner> device CA``, ``CA:true``
        with path length 0, key usage keyCertSign and cRLSign, valid ten years; name constraints
        (not critical: strongSwan 5.9 refuses a CA whose critical constraints name addresses)
        permit the DNS names under ``devices.invalid``, the DNS names of ``gateway`` and exactly
        its addresses (with no address there, none at all); its extended key usage is
        :data:`CA_PURPOSES`. ``directory`` is made (0700) if missing. Two processes making it at
        once end with the same CA. A CA already there is loaded as it is: ``gateway`` shapes a
        new CA only (:meth:`gateway` refuses a name the CA does not permit).

        Args:
            directory: where ``device-ca.key`` (0600) and ``device-ca.crt`` (0644) are kept.
            owner: the Target's name: 1-63 of letters, digits, ``.``, ``_``, ``-``, starting with a
                letter or digit. One longer than 49 is cut to 48 and ``~`` in the CA's name,
                which may hold 64 characters.
            gateway: the gateway's IKE identity and the addresses devices reach it at: what its
                certificate may name (a name that is no DNS name is never in a certificate's
                subjectAltName, so it permits nothing).
            clock: the current time (aware), for certificate validity.

        Raises:
            InvalidInput: ``owner`` cannot be put in the CA's name, or a ``gateway`` entry is
                neither a gateway identity nor an IP address.
            DeviceCAError: the directory or a file in it is a link, not the service's own, or
                open to others; the key does not match the certificate; the CA is another
                owner's; a creation died half-way (the message names the file to move away).
        """
        common_name = certs.ca_common_name(certs.check_name(owner, what="owner", limit=certs.MAX_OWNER))
        constraints = certs.name_constraints(gateway)
        directory = Path(directory).absolute()
        with open_directory(directory) as dfd:
            key, cert = _load_or_create_ca(dfd, directory, common_name, constraints, clock)
        return cls(directory=directory, key=key, cert=cert, clock=clock)

    # ----------------------------------------------------------------------- the CA certificate

    @property
    def cert_der(self) -> bytes:
        """The CA certificate, DER (what devices and charon trust)."""
        return self._cert.public_bytes(serialization.Encoding.DER)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def common_name(self) -> str:
        """The CA's common name, ``qoss <owner> device CA``."""
        return certs.common_name(self._cert)

    @property
    def constrained(self) -> bool:
        """Whether the CA certificate limits the names below it (False for a CA made before it
        carried name constraints: replace it, docs/agent.md "Rotating the device CA")."""
        return certs.constraints_of(self._cert) is not None

    @staticmethod
    def subject_dn(identity: str) -> str:
        """A device identity as strongSwan writes the subject of its certificate: ``CN=<identity>``.

        Raises:
            InvalidInput: not a device identity (see :meth:`issue_device`).
        """
        return f"CN={certs.check_name(identity, what='identity', limit=certs.MAX_CN)}"

    # ----------------------------------------------------------------------- the gateway

    def gateway(self, *, identity: str, addresses: Sequence[str]) -> GatewayCredential:
        """The gateway's own certificate and key, issued by this CA and kept beside it.

        The certificate has ``CN=identity``; subjectAltName dNSName ``identity`` when it is a
        DNS name, and iPAddress for each of ``addresses`` (and for ``identity`` when it is an
        address); extended key usage serverAuth and IKE intermediate; key usage
        digitalSignature; one year's validity. The stored pair is returned while it matches
        ``identity`` and ``addresses``, was issued by this CA and has 30 days or more left;
        otherwise a new key and certificate replace it.

        Args:
            identity: the gateway's IKE identity: a host name or an IP address.
            addresses: the IP addresses devices reach the gateway at.

        Raises:
            InvalidInput: ``identity`` or an address cannot be used.
            DeviceCAError: a gateway file is a link, not the service's own, or open to others; the
                CA's name constraints do not permit ``identity`` or an address (the gateway moved
                since the CA was made: the message says how to make a new CA).
        """
        identity = certs.check_gateway_identity(identity)
        ips = certs.check_addresses(addresses)
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_address(identity)
            ips = ips if ip in ips else (*ips, ip)
        dns = (identity,) if certs.is_dns_name(identity) else ()
        outside = certs.outside(certs.constraints_of(self._cert), dns=dns, ips=ips)
        if outside:
            raise DeviceCAError(f"the device CA in {self._directory} may not vouch for {', '.join(outside)}: its "
                                "name constraints hold the gateway's names and addresses as they were when it was "
                                "made; make a new CA (docs/agent.md, \"Rotating the device CA\")")
        now = self._now()
        with open_directory(self._directory) as dfd:
            fcntl.flock(dfd, fcntl.LOCK_EX)  # released when the descriptor closes
            stored = self._stored_gateway(dfd)
            if stored is not None and self._gateway_fits(stored[1], identity=identity, dns=dns, ips=ips, now=now):
                key, cert = stored
            else:
                key = ec.generate_private_key(ec.SECP256R1())
                cert = self._sign(
                    certs.builder(identity, key, not_before=now - _BACKDATE, not_after=now + _GATEWAY_LIFETIME)
                    .add_extension(x509.SubjectAlternativeName([*map(x509.DNSName, dns), *map(x509.IPAddress, ips)]),
                                   critical=False)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, IKE_INTERMEDIATE]),
                                   critical=False))
                replace_file(dfd, GATEWAY_KEY, certs.key_pem(key), mode=0o600)
                replace_file(dfd, GATEWAY_CERT, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        key_der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return GatewayCredential(cert_der=cert.public_bytes(serialization.Encoding.DER), key_der=key_der,
                                 key_type="ecdsa")

    def _stored_gateway(self, dfd: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
        """The stored gateway pair, or None if missing, unreadable as a pair, or not matching."""
        key_file = read_file(dfd, self._directory, GATEWAY_KEY, secret=True)
        cert_file = read_file(dfd, self._directory, GATEWAY_CERT, secret=False)
        if key_file is None or cert_file is None:
            return None
        try:
            key = certs.parse_key(key_file.data)
            cert = x509.load_pem_x509_certificate(cert_file.data)
        except ValueError:
            return None
        return (key, cert) if certs.matches(key, cert) else None

    def _gateway_fits(self, cert: x509.Certificate, *, identity: str, dns: tuple[str, ...],
                      ips: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...], now: datetime) -> bool:
        try:
            cert.verify_directly_issued_by(self._cert)
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
            return False
        return (certs.common_name(cert) == identity
                and set(san.get_values_for_type(x509.DNSName)) == set(dns)
                and set(san.get_values_for_type(x509.IPAddress)) == set(ips)
                and cert.not_valid_after_utc - now >= _GATEWAY_RENEW)

    # ----------------------------------------------------------------------- devices

    def issue_device(self, *, identity: str, lifetime: int, name: str | None = None,
                     legacy: bool = False) -> DeviceCredential:
        """A new key and certificate for one device, packed as PKCS#12 under a one-time passphrase.

        The certificate has ``CN=identity`` (and subjectAltName dNSName ``identity`` when it is
        a DNS name, which Apple's clients match their local identifier against; a CA with name
        constraints issues only names under ``devices.invalid``), extended key
        usage clientAuth and IKE intermediate, key usage digitalSignature; it is valid from five
        minutes ago for ``lifetime`` seconds from now, with a random 159-bit serial. The key is
        never written anywhere but into the returned PKCS#12.

        Args:
            identity: the device's identity, e.g. ``0a1b2c3d4e5f.alice.devices.invalid``
                (:func:`~app.domain.agent.conns.device_identity`): 1-64 of letters, digits, ``.``,
                ``_``, ``-``, starting with a letter or digit.
            lifetime: seconds, from an hour to 90 days.
            name: the PKCS#12 friendly name clients show (default ``identity``): 1-64
                printable characters.
            legacy: the PKCS#12 encrypted the old way (3DES, SHA-1 MAC), for clients that open
                nothing else (Apple's); otherwise PBES2 with AES-256 and a SHA-256 MAC.

        Raises:
            InvalidInput: ``identity``, ``lifetime`` or ``name`` cannot be used, or the CA's name
                constraints do not permit ``identity``.
        """
        identity = certs.check_name(identity, what="identity", limit=certs.MAX_CN)
        constraints = certs.constraints_of(self._cert)
        if constraints is not None and (not certs.is_dns_name(identity)
                                        or certs.outside(constraints, dns=(identity,), ips=())):
            raise InvalidInput(f"a device's identity is a DNS name under {DEVICE_NAMESPACE} (the only device names "
                               f"this CA may vouch for), not {identity!r:.80}")
        if isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime not in _DEVICE_LIFETIME:
            raise InvalidInput(f"a device certificate's lifetime is {_DEVICE_LIFETIME.start} to "
                               f"{_DEVICE_LIFETIME.stop - 1} seconds (an hour to 90 days), not {lifetime!r}")
        friendly = identity if name is None else name
        if not isinstance(friendly, str) or not 1 <= len(friendly) <= certs.MAX_CN or not friendly.isprintable():
            raise InvalidInput("a credential's name is 1-64 printable characters")
        now = self._now()
        key = ec.generate_private_key(ec.SECP256R1())
        builder = certs.builder(identity, key, not_before=now - _BACKDATE, not_after=now + timedelta(seconds=lifetime))
        if certs.is_dns_name(identity):
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(identity)]), critical=False)
        cert = self._sign(
            builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, IKE_INTERMEDIATE]),
                                  critical=False))
        passphrase = certs.passphrase()
        algorithm, mac = ((pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC, hashes.SHA1()) if legacy  # noqa: S303
                          else (pkcs12.PBES.PBESv2SHA256AndAES256CBC, hashes.SHA256()))
        encryption = (serialization.PrivateFormat.PKCS12.encryption_builder()
                      .kdf_rounds(_KDF_ROUNDS)
                      .key_cert_algorithm(algorithm)
                      .hmac_hash(mac)
                      .build(passphrase.encode("ascii")))
        ca = pkcs12.PKCS12Certificate(self._cert, self.common_name.encode("utf-8"))
        p12 = pkcs12.serialize_key_and_certificates(friendly.encode("utf-8"), key, cert, [ca], encryption)
        return DeviceCredential(p12=p12, passphrase=passphrase, cert_der=cert.public_bytes(serialization.Encoding.DER),
                                serial=cert.serial_number, not_after=cert.not_valid_after_utc)

    # ----------------------------------------------------------------------- helpers

    def _now(self) -> datetime:
        return certs.aware(self._clock())

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        """Finish an end-entity certificate: issuer, key usage, CA:false, authority key id; signed."""
        ca_key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key())
        return (builder.issuer_name(self._cert.subject)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(certs.key_usage(digital_signature=True), critical=True)
                .add_extension(ca_key_id, critical=False)
                .sign(self._key, hashes.SHA256()))


# --------------------------------------------------------------------------- making and loading the CA


def _load_or_create_ca(dfd: int, directory: Path, common_name: str, constraints: x509.NameConstraints,
                       clock: Callable[[], datetime]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Load the CA; make it if there is no key file; wait while another process is making it."""
    deadline = time.monotonic() + _SETTLE
    while True:
        key_file = read_file(dfd, directory, CA_KEY, secret=True)
        if key_file is None:
            made = _create_ca(dfd, common_name, constraints, clock)
            if made is not None:
                return made
            continue  # another process created the key first: load theirs
        cert_file = read_file(dfd, directory, CA_CERT, secret=False)
        try:
            key = certs.parse_key(key_file.data)
            problem = None if cert_file is not None else f"{directory / CA_CERT} is missing beside {CA_KEY}"
        except ValueError:
            problem = f"{directory / CA_KEY} is not an ECDSA P-256 private key in PEM"
        # The key is written before the certificate: a key younger than _SETTLE without its
        # certificate, or with an older (stale) one, is another process's creation under way.
        under_way = time.time() - key_file.mtime < _SETTLE and (
            problem is not None or (cert_file is not None and cert_file.mtime < key_file.mtime))
        if under_way and time.monotonic() < deadline:
            time.sleep(_POLL)
            continue
        if problem is not None:
            raise DeviceCAError(f"{problem} (a creation that did not finish?): move {directory / CA_KEY} away "
                                "to make a new CA, which every device must then trust anew")
        assert cert_file is not None
        return key, _check_ca_cert(cert_file.data, key, directory, common_name)


def _check_ca_cert(pem: bytes, key: ec.EllipticCurvePrivateKey, directory: Path,
                   common_name: str) -> x509.Certificate:
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise DeviceCAError(f"{directory / CA_CERT} is not a PEM certificate") from None
    if not certs.matches(key, cert):
        raise DeviceCAError(f"{directory / CA_KEY} does not match the certificate {directory / CA_CERT}: "
                            "restore the pair, or move both away to make a new CA")
    found = certs.common_name(cert)
    if found != common_name:
        raise DeviceCAError(f"{directory} holds the CA {found!r}, not {common_name!r}: "
                            "give each Target its own directory")
    return cert


def _create_ca(dfd: int, common_name: str, constraints: x509.NameConstraints,
               clock: Callable[[], datetime]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    """Make the CA, unless another process creates the key file first (then None)."""
    now = certs.aware(clock())
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(certs.key_usage(key_cert_sign=True, crl_sign=True), critical=True)
            # Not critical, as RFC 5280 asks: strongSwan 5.9 cannot parse an iPAddress subtree and
            # refuses the whole certificate when this extension is critical. Windows, Apple, OpenSSL
            # and browsers enforce name constraints either way (the CA/Browser Forum's Baseline
            # Requirements allow them non-critical for such software); strongSwan's own clients keep
            # this CA in their own store, for this VPN only.
            .add_extension(constraints, critical=False)
            .add_extension(x509.ExtendedKeyUsage(CA_PURPOSES), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    if not create_file(dfd, CA_KEY, certs.key_pem(key), mode=0o600):
        return None
    try:
        replace_file(dfd, CA_CERT, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    except BaseException:
        with contextlib.suppress(OSError):  # no key without its certificate: the next attempt starts over
            os.unlink(CA_KEY, dir_fd=dfd)
        raise
    return key, cert


