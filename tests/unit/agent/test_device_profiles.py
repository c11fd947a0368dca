"""Device profiles: each platform's file reads back with the negotiated suite in the platform's own
names; a suite a platform cannot name, or a field that would break the format, writes nothing."""

from __future__ import annotations

import base64
import configparser
import dataclasses
import json
import plistlib
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from app.adapters.agent.profiles import DeviceProfileInput, Inexpressible, Profile, parse_swanctl, write_profile
from app.domain.agent.platforms import LABELS, PLATFORMS, check_names, express, expressible_keywords
from app.domain.algorithms import CATALOGUE, Kind
from app.domain.errors import InvalidInput
from app.domain.proposals import InvalidProposal

# The vendors' documented enumerations, written out here independently of the module under test.
APPLE_DOCUMENTED: dict[str, set[Any]] = {
    "EncryptionAlgorithm": {"DES", "3DES", "AES-128", "AES-256", "AES-128-GCM", "AES-256-GCM", "ChaCha20Poly1305"},
    "IntegrityAlgorithm": {"SHA1-96", "SHA1-160", "SHA2-256", "SHA2-384", "SHA2-512"},
    "DiffieHellmanGroup": {1, 2, 5, 14, 15, 16, 17, 18, 19, 20, 21, 31, 32},
    "LifeTimeInMinutes": set(range(10, 1441)),
}
WINDOWS_DOCUMENTED: dict[str, set[Any]] = {
    "EncryptionMethod": {"DES", "DES3", "AES128", "AES192", "AES256", "GCMAES128", "GCMAES256"},
    "IntegrityCheckMethod": {"MD5", "SHA1", "SHA256", "SHA384"},
    "DHGroup": {"None", "Group1", "Group2", "Group14", "ECP256", "ECP384", "Group24"},
    "CipherTransformConstants": {"DES", "DES3", "AES128", "AES192", "AES256", "GCMAES128", "GCMAES192", "GCMAES256",
                                 "None"},
    "AuthenticationTransformConstants": {"MD596", "SHA196", "SHA256128", "GCMAES128", "GCMAES192", "GCMAES256",
                                         "None"},
    "PfsGroup": {"None", "PFS1", "PFS2", "PFS2048", "ECP256", "ECP384", "PFSMM", "PFS24"},
}
APPLE_KEYWORDS = frozenset({
    "des", "3des", "aes128", "aes256", "aes128gcm16", "aes256gcm16", "chacha20poly1305",
    "sha1", "sha1_160", "sha256", "sha384", "sha512", "prfsha1", "prfsha256", "prfsha384", "prfsha512",
    "modp768", "modp1024", "modp1536", "modp2048", "modp3072", "modp4096", "modp6144", "modp8192",
    "ecp256", "ecp384", "ecp521", "x25519", "x448",
})
WINDOWS_KEYWORDS = frozenset({
    "des", "3des", "aes128", "aes192", "aes256", "aes128gcm16", "aes192gcm16", "aes256gcm16",
    "md5", "sha1", "sha256", "sha384", "prfmd5", "prfsha1", "prfsha256", "prfsha384",
    "modp768", "modp1024", "modp2048", "modp2048s256", "ecp256", "ecp384",
})

GCM_IKE, GCM_ESP = "aes256gcm16-prfsha384-ecp384", "aes256gcm16-ecp384"
DEVICE = "0a1b2c3d4e5f.alice"
CA_NAME = "qoss target-1 device CA"


class Credentials(NamedTuple):
    ca_der: bytes
    device_der: bytes
    p12: bytes  # PBES2 / AES-256 (BestAvailableEncryption)
    p12_legacy: bytes  # 3DES with a SHA-1 MAC, which Apple's clients open


@pytest.fixture(scope="module")
def creds() -> Credentials:
    """A throwaway CA, a device certificate (CN and subjectAltName dNSName) and its PKCS#12 files."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    device = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DEVICE)]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName(DEVICE)]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    legacy = (serialization.PrivateFormat.PKCS12.encryption_builder().kdf_rounds(2048)
              .key_cert_algorithm(pkcs12.PBES.PBESv1SHA1And3KeyTripleDESCBC)
              .hmac_hash(hashes.SHA1())  # noqa: S303 - the legacy PKCS#12 MAC, all Apple's clients open
              .build(b"pass"))
    return Credentials(
        ca_der=ca.public_bytes(serialization.Encoding.DER),
        device_der=device.public_bytes(serialization.Encoding.DER),
        p12=pkcs12.serialize_key_and_certificates(b"alice", key, device, [ca],
                                                  serialization.BestAvailableEncryption(b"pass")),
        p12_legacy=pkcs12.serialize_key_and_certificates(b"alice", key, device, [ca], legacy),
    )


def make_input(creds: Credentials, platform: str, **changes: Any) -> DeviceProfileInput:
    """The example device: Apple gets its identity as the certificate's dNSName and the legacy PKCS#12."""
    apple = platform == "apple"
    base = DeviceProfileInput(
        name="qoss target-1", uuid="6f1c2f0e-4a8b-4c1d-9e2f-0a1b2c3d4e5f", platform=platform,
        remote_address="192.0.2.10", remote_id="target-1", local_id=DEVICE if apple else f"CN={DEVICE}",
        ca_cert_der=creds.ca_der, p12=creds.p12_legacy if apple else creds.p12, p12_name="alice-phone.p12",
        ike_proposal=GCM_IKE, esp_proposal=GCM_ESP, ike_lifetime=14400, child_lifetime=3600,
        remote_ts=("10.3.0.0/24", "2001:db8:3::/64"), domains=(), device_cert_der=creds.device_der)
    return dataclasses.replace(base, **changes)


def apple_payloads(profile: Profile) -> dict[str, dict[str, Any]]:
    top = plistlib.loads(profile.content)
    assert top["PayloadType"] == "Configuration"
    assert top["PayloadVersion"] == 1
    return {payload["PayloadType"]: payload for payload in top["PayloadContent"]}


def windows_ipsec(script: str) -> dict[str, str]:
    (line,) = [ln for ln in script.splitlines() if ln.startswith("Set-VpnConnectionIPsecConfiguration ")]
    params = dict(re.findall(r" -(\w+) (\S+)", line))
    assert params.pop("ConnectionName") == "$Name"
    return params


def read_keyfile(profile: Profile) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(profile.content.decode("utf-8"))
    return parser


# --------------------------------------------------------------------------- each platform reads back


def test_android_sswan_holds_the_proposals_the_ca_the_p12_and_the_split_tunnel(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "android"))
    doc = json.loads(profile.content.decode("utf-8"))
    assert (profile.filename, profile.media_type, dict(profile.files)) == (
        "qoss-target-1.sswan", "application/vnd.strongswan.profile", {})
    assert doc["uuid"] == "6f1c2f0e-4a8b-4c1d-9e2f-0a1b2c3d4e5f"
    assert doc["type"] == "ikev2-cert"
    assert doc["remote"]["addr"] == "192.0.2.10"
    assert doc["remote"]["id"] == "target-1"
    assert base64.b64decode(doc["remote"]["cert"]) == creds.ca_der
    assert doc["local"]["id"] == f"CN={DEVICE}"
    assert base64.b64decode(doc["local"]["p12"]) == creds.p12
    assert (doc["ike-proposal"], doc["esp-proposal"]) == (GCM_IKE, GCM_ESP)
    assert doc["split-tunneling"] == {"subnets": ["10.3.0.0/24", "2001:db8:3::/64"],
                                      "block-ipv4": False, "block-ipv6": False}


def test_apple_mobileconfig_says_the_suite_in_apples_names(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "apple", domains=("corp.example", "lab.example")))
    payloads = apple_payloads(profile)
    ikev2 = payloads["com.apple.vpn.managed"]["IKEv2"]
    assert (profile.filename, profile.media_type) == ("qoss-target-1.mobileconfig", "application/x-apple-aspen-config")
    assert payloads["com.apple.vpn.managed"]["VPNType"] == "IKEv2"
    assert ikev2["IKESecurityAssociationParameters"] == {
        "EncryptionAlgorithm": "AES-256-GCM", "IntegrityAlgorithm": "SHA2-384", "DiffieHellmanGroup": 20,
        "LifeTimeInMinutes": 240}
    assert ikev2["ChildSecurityAssociationParameters"] == {
        "EncryptionAlgorithm": "AES-256-GCM", "DiffieHellmanGroup": 20, "LifeTimeInMinutes": 60}
    assert ikev2["EnablePFS"] == 1
    assert (ikev2["RemoteAddress"], ikev2["RemoteIdentifier"], ikev2["LocalIdentifier"]) == (
        "192.0.2.10", "target-1", DEVICE)
    assert (ikev2["AuthenticationMethod"], ikev2["ExtendedAuthEnabled"], ikev2["CertificateType"]) == (
        "Certificate", 0, "ECDSA256")
    assert ikev2["ServerCertificateIssuerCommonName"] == CA_NAME
    assert ikev2["PayloadCertificateUUID"] == payloads["com.apple.security.pkcs12"]["PayloadUUID"]
    assert payloads["com.apple.security.pkcs12"]["PayloadContent"] == creds.p12_legacy
    assert "Password" not in payloads["com.apple.security.pkcs12"]
    assert payloads["com.apple.security.root"]["PayloadContent"] == creds.ca_der
    assert ikev2["IncludeAllNetworks"] == 0
    assert ikev2["OnDemandEnabled"] == 1
    assert ikev2["OnDemandRules"] == [{"Action": "EvaluateConnection", "ActionParameters": [
        {"Domains": ["corp.example", "lab.example"], "DomainAction": "ConnectIfNeeded"}]}]


def test_apple_without_domains_is_connected_by_hand(creds: Credentials) -> None:
    ikev2 = apple_payloads(write_profile(make_input(creds, "apple")))["com.apple.vpn.managed"]["IKEv2"]
    assert ikev2["OnDemandEnabled"] == 0
    assert "OnDemandRules" not in ikev2


def test_apple_child_without_key_exchange_has_no_pfs(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "apple", ike_proposal="aes128-sha256-modp2048",
                                       esp_proposal="aes128-sha256"))
    ikev2 = apple_payloads(profile)["com.apple.vpn.managed"]["IKEv2"]
    assert ikev2["EnablePFS"] == 0
    assert ikev2["IKESecurityAssociationParameters"] == {
        "EncryptionAlgorithm": "AES-128", "IntegrityAlgorithm": "SHA2-256", "DiffieHellmanGroup": 14,
        "LifeTimeInMinutes": 240}
    assert ikev2["ChildSecurityAssociationParameters"] == {
        "EncryptionAlgorithm": "AES-128", "IntegrityAlgorithm": "SHA2-256", "LifeTimeInMinutes": 60}


def test_windows_script_sets_the_suite_in_windows_names(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "windows"))
    assert profile.content.startswith(b"\xef\xbb\xbf")
    script = profile.content.decode("utf-8-sig")
    assert "\n" not in script.replace("\r\n", "")
    assert windows_ipsec(script) == {
        "EncryptionMethod": "GCMAES256", "IntegrityCheckMethod": "SHA384", "DHGroup": "ECP384",
        "CipherTransformConstants": "GCMAES256", "AuthenticationTransformConstants": "GCMAES256", "PfsGroup": "ECP384"}
    assert "$Name = 'qoss target-1'" in script
    (add,) = [ln for ln in script.splitlines() if ln.startswith("Add-VpnConnection ")]
    for part in ("-ServerAddress '192.0.2.10'", "-TunnelType Ikev2", "-AuthenticationMethod MachineCertificate",
                 "-EncryptionLevel Required", "-SplitTunneling"):
        assert part in add
    assert re.findall(r"-DestinationPrefix '([^']+)'", script) == ["10.3.0.0/24", "2001:db8:3::/64"]
    assert "Cert:\\LocalMachine\\Root" in script
    assert "Import-PfxCertificate" in script
    assert "Read-Host -AsSecureString" in script
    assert dict(profile.files) == {"alice-phone.p12": creds.p12, "qoss-target-1-ca.cer": creds.ca_der}


def test_windows_cbc_suite_without_pfs(creds: Credentials) -> None:
    script = write_profile(make_input(creds, "windows", ike_proposal="aes128-sha256-modp2048",
                                      esp_proposal="aes256-sha256")).content.decode("utf-8-sig")
    assert windows_ipsec(script) == {
        "EncryptionMethod": "AES128", "IntegrityCheckMethod": "SHA256", "DHGroup": "Group14",
        "CipherTransformConstants": "AES256", "AuthenticationTransformConstants": "SHA256128", "PfsGroup": "None"}


def test_windows_leaves_out_dns_triggers_it_could_not_start(creds: Credentials) -> None:
    script = write_profile(make_input(creds, "windows", domains=("corp.example",))).content.decode("utf-8-sig")
    assert "Add-VpnConnectionTriggerDnsConfiguration -ConnectionName" not in script


def test_networkmanager_keyfile_holds_the_proposals_and_the_networks(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "networkmanager"))
    keyfile = read_keyfile(profile)
    vpn = keyfile["vpn"]
    assert (profile.filename, profile.media_type) == ("qoss-target-1.nmconnection", "text/plain; charset=utf-8")
    assert dict(keyfile["connection"]) == {"id": "qoss target-1", "uuid": "6f1c2f0e-4a8b-4c1d-9e2f-0a1b2c3d4e5f",
                                           "type": "vpn", "autoconnect": "false"}
    assert vpn["service-type"] == "org.freedesktop.NetworkManager.strongswan"
    assert (vpn["proposal"], vpn["ike"], vpn["esp"]) == ("yes", GCM_IKE, GCM_ESP)
    assert (vpn["address"], vpn["remote-identity"], vpn["local-identity"]) == ("192.0.2.10", "target-1",
                                                                              f"CN={DEVICE}")
    assert (vpn["method"], vpn["cert-source"], vpn["virtual"]) == ("cert", "file", "yes")
    assert vpn["remote-ts"] == "10.3.0.0/24;2001:db8:3::/64"
    assert vpn["certificate"].endswith("/qoss-target-1-ca.pem")
    assert vpn["usercert"].endswith("/alice-phone.crt")
    assert vpn["userkey"].endswith("/alice-phone.key")
    assert (keyfile["ipv4"]["route1"], keyfile["ipv4"]["never-default"]) == ("10.3.0.0/24", "true")
    assert keyfile["ipv6"]["route1"] == "2001:db8:3::/64"
    pem = x509.load_der_x509_certificate(creds.ca_der).public_bytes(serialization.Encoding.PEM)
    assert dict(profile.files) == {"alice-phone.p12": creds.p12, "qoss-target-1-ca.pem": pem}


def test_swanctl_conf_holds_the_proposals_the_identities_and_the_networks(creds: Credentials) -> None:
    profile = write_profile(make_input(creds, "swanctl"))
    conf = parse_swanctl(profile.content.decode("utf-8"))
    conn = conf["connections"]["qoss-target-1"]  # type: ignore[index]
    child = conn["children"]["qoss-target-1"]
    assert (conn["proposals"], child["esp_proposals"]) == (GCM_IKE, GCM_ESP)
    assert (conn["version"], conn["remote_addrs"], conn["vips"]) == ("2", "192.0.2.10", "0.0.0.0,::")
    assert conn["local"] == {"auth": "pubkey", "id": f"CN={DEVICE}"}
    assert conn["remote"] == {"auth": "pubkey", "id": "target-1", "cacerts": "qoss-target-1-ca.pem"}
    assert child["remote_ts"] == "10.3.0.0/24,2001:db8:3::/64"
    assert (conn["rekey_time"], child["rekey_time"], child["start_action"]) == ("14400s", "3600s", "none")
    assert "secrets" not in conf
    assert set(profile.files) == {"alice-phone.p12", "qoss-target-1-ca.pem"}
    assert f"--ike-proposal {GCM_IKE} --esp-proposal {GCM_ESP}" in profile.content.decode("utf-8")


def test_parse_swanctl_reads_quotes_escapes_comments_and_bare_values() -> None:
    text = 'a {  # a comment\n  b = "x \\"y\\" \\\\z"\n  c = bare value\n  d { }\n}\n'
    assert parse_swanctl(text) == {"a": {"b": 'x "y" \\z', "c": "bare value", "d": {}}}
    with pytest.raises(ValueError, match="not closed"):
        parse_swanctl("a {\n b = 1\n")


def test_strongswan_platforms_take_the_proposals_as_they_are() -> None:
    for platform in ("android", "networkmanager", "swanctl"):
        assert express(platform, ike_proposal="aes256-sha256-prfsha256-ecp256", esp_proposal="chacha20poly1305-x25519",
                       ike_lifetime=1, child_lifetime=1) == {
            "strongswan": {"ike": "aes256-sha256-prfsha256-ecp256", "esp": "chacha20poly1305-x25519"}}


# --------------------------------------------------------------------------- documented names only

SUITES = [
    (GCM_IKE, GCM_ESP),
    ("aes128-sha256-modp2048", "aes128gcm16-ecp256"),
    ("aes256-sha384-prfsha384-ecp384", "aes256-sha256-modp2048"),
    ("aes128gcm16-prfsha256-ecp256", "aes128-sha1"),
    ("3des-sha1-modp1024", "des-md5-modp768"),
]


@pytest.mark.parametrize(("ike", "esp"), SUITES)
@pytest.mark.parametrize(("platform", "documented"), [("apple", APPLE_DOCUMENTED), ("windows", WINDOWS_DOCUMENTED)])
def test_every_value_belongs_to_the_vendors_enumeration(platform: str, documented: dict[str, set[Any]],
                                                         ike: str, esp: str) -> None:
    try:
        expressed = express(platform, ike_proposal=ike, esp_proposal=esp, ike_lifetime=3600, child_lifetime=3600)
    except Inexpressible:
        return  # some suites are not for every platform; what is written is what matters
    check_names(platform, expressed)
    for part in expressed.values():
        for parameter, value in part.items():
            assert value in documented[parameter], (parameter, value)


def test_check_names_refuses_an_undocumented_value() -> None:
    windows = express("windows", ike_proposal=GCM_IKE, esp_proposal=GCM_ESP, ike_lifetime=60, child_lifetime=60)
    with pytest.raises(ValueError, match="PFS14"):
        check_names("windows", {"ipsec": {**windows["ipsec"], "PfsGroup": "PFS14"}})
    apple = express("apple", ike_proposal=GCM_IKE, esp_proposal=GCM_ESP, ike_lifetime=600, child_lifetime=600)
    with pytest.raises(ValueError, match="LifeTimeInMinutes"):
        check_names("apple", {**apple, "child": {**apple["child"], "LifeTimeInMinutes": 5}})
    with pytest.raises(ValueError, match="Group"):
        check_names("apple", {**apple, "ike": {**apple["ike"], "DHGroup": 20}})
    with pytest.raises(InvalidProposal):
        check_names("swanctl", {"strongswan": {"ike": "aes256-sha256", "esp": "aes256gcm16"}})


def test_expressible_keywords_are_exactly_the_mapped_ones() -> None:
    assert expressible_keywords("apple") == APPLE_KEYWORDS
    assert expressible_keywords("windows") == WINDOWS_KEYWORDS
    for platform in ("android", "networkmanager", "swanctl"):
        assert expressible_keywords(platform) is None


def _candidates(keyword: str) -> list[tuple[str, str]]:
    """Proposal pairs that use ``keyword`` in its role, the rest a suite both platforms can say."""
    base_ike, base_esp = "aes256-sha256-modp2048", "aes256-sha256-modp2048"
    kind = CATALOGUE[keyword].kind
    if kind is Kind.ENCRYPTION:
        return [(f"{keyword}-sha256-modp2048", base_esp), (base_ike, f"{keyword}-sha256-modp2048")]
    if kind is Kind.AEAD:
        return [(f"{keyword}-prfsha256-modp2048", base_esp), (base_ike, f"{keyword}-modp2048")]
    if kind is Kind.INTEGRITY:
        return [(f"aes256-{keyword}-modp2048", base_esp), (base_ike, f"aes256-{keyword}-modp2048")]
    if kind is Kind.PRF:
        return [(f"aes256gcm16-{keyword}-modp2048", base_esp)]
    return [(f"aes256-sha256-{keyword}", base_esp), (base_ike, f"aes256-sha256-{keyword}")]


@pytest.mark.parametrize("platform", ["apple", "windows"])
def test_expressible_keywords_agree_with_express(platform: str) -> None:
    keywords = expressible_keywords(platform)
    assert keywords is not None
    for keyword in CATALOGUE:
        said, refused = False, []
        for ike, esp in _candidates(keyword):
            try:
                express(platform, ike_proposal=ike, esp_proposal=esp, ike_lifetime=3600, child_lifetime=3600)
            except InvalidProposal:
                continue  # not a proposal strongSwan takes in that role
            except Inexpressible as exc:
                refused.append(exc.keyword)
                continue
            said = True
        assert said == (keyword in keywords), keyword
        assert set(refused) <= {keyword}, (keyword, refused)  # a refusal names this keyword, not the rest


# --------------------------------------------------------------------------- what cannot be said writes nothing


@pytest.mark.parametrize(("platform", "ike", "esp", "part", "role", "keyword"), [
    ("windows", "aes256-sha256-ecp256", "aes256-sha512-x448", "ESP", "integrity", "sha512"),
    ("windows", "chacha20poly1305-prfsha256-ecp256", GCM_ESP, "IKE", "AEAD", "chacha20poly1305"),
    ("windows", "aes256-sha256-x25519", GCM_ESP, "IKE", "key exchange", "x25519"),
    ("windows", "aes256gcm16-prfsha512-ecp384", GCM_ESP, "IKE", "PRF", "prfsha512"),
    ("apple", "aes192gcm16-prfsha256-ecp256", GCM_ESP, "IKE", "AEAD", "aes192gcm16"),
    ("apple", GCM_IKE, "aes192-sha256-ecp256", "ESP", "encryption", "aes192"),
    ("apple", "aes256-sha256-prfsha384-ecp256", GCM_ESP, "IKE", "PRF", "prfsha384"),
    ("windows", "aes256-sha256-prfsha384-ecp256", GCM_ESP, "IKE", "PRF", "prfsha384"),
    ("apple", GCM_IKE, "aes256gcm12-ecp384", "ESP", "AEAD", "aes256gcm12"),
    ("apple", GCM_IKE, "null-sha256", "ESP", "encryption", "null"),
])
def test_an_inexpressible_suite_names_the_platform_and_keyword_and_writes_nothing(
        creds: Credentials, platform: str, ike: str, esp: str, part: str, role: str, keyword: str) -> None:
    with pytest.raises(Inexpressible) as caught:
        express(platform, ike_proposal=ike, esp_proposal=esp, ike_lifetime=3600, child_lifetime=3600)
    assert (caught.value.platform, caught.value.part, caught.value.role, caught.value.keyword) == (
        platform, part, role, keyword)
    assert str(caught.value).startswith(f"{LABELS[platform]} cannot express {part} {role} {keyword}")
    assert isinstance(caught.value, ValueError)
    profile = None
    with pytest.raises(Inexpressible, match=re.escape(keyword)):
        profile = write_profile(make_input(creds, platform, ike_proposal=ike, esp_proposal=esp))
    assert profile is None


def test_windows_message_reads_as_the_platform_says_it() -> None:
    with pytest.raises(Inexpressible, match=r"^Windows 10/11 built-in IKEv2 cannot express ESP integrity sha512$"):
        express("windows", ike_proposal="aes256-sha256-ecp256", esp_proposal="aes256-sha512-x448",
                ike_lifetime=3600, child_lifetime=3600)


@pytest.mark.parametrize(("seconds", "minutes"), [(600, 10), (3629, 60), (3630, 61), (86400, 1440)])
def test_apple_lifetimes_round_to_the_nearest_minute(seconds: int, minutes: int) -> None:
    expressed = express("apple", ike_proposal=GCM_IKE, esp_proposal=GCM_ESP, ike_lifetime=seconds,
                        child_lifetime=seconds)
    assert expressed["ike"]["LifeTimeInMinutes"] == expressed["child"]["LifeTimeInMinutes"] == minutes


@pytest.mark.parametrize("seconds", [60, 569, 86431, 7 * 86400])
def test_an_apple_lifetime_out_of_range_is_refused_not_clamped(creds: Credentials, seconds: int) -> None:
    with pytest.raises(Inexpressible, match=rf"cannot express ESP lifetime {seconds} s"):
        write_profile(make_input(creds, "apple", child_lifetime=seconds))


def test_an_unknown_platform_names_the_known_ones(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match="one of android, apple, windows, networkmanager, swanctl"):
        express("blackberry", ike_proposal=GCM_IKE, esp_proposal=GCM_ESP, ike_lifetime=1, child_lifetime=1)
    with pytest.raises(ValueError, match="blackberry"):
        expressible_keywords("blackberry")
    with pytest.raises(ValueError, match="blackberry"):
        write_profile(make_input(creds, "blackberry"))


# --------------------------------------------------------------------------- fields that would break a format


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("field", ["name", "remote_id", "local_id", "remote_address"])
@pytest.mark.parametrize("bad", ["\n", "\r", "\x00", "\u2028"])
def test_an_injected_line_break_is_refused_naming_the_field(creds: Credentials, platform: str, field: str,
                                                            bad: str) -> None:
    value = getattr(make_input(creds, platform), field)
    with pytest.raises(InvalidInput, match=f"^{field}: "):
        write_profile(make_input(creds, platform, **{field: f"{value}{bad}x = 1"}))


@pytest.mark.parametrize("remote_ts", [("10.3.0.1/24",), ("10.3.0.0/24\n",), (), ("not-a-net",)])
def test_remote_ts_must_be_networks(creds: Credentials, remote_ts: tuple[str, ...]) -> None:
    with pytest.raises(InvalidInput, match=r"^remote_ts: "):
        write_profile(make_input(creds, "android", remote_ts=remote_ts))


@pytest.mark.parametrize("p12_name", ["../alice.p12", "alice.p12\n", "alice.txt", "qoss-target-1-ca.pem.p12x", ""])
def test_the_p12_file_name_is_a_plain_name(creds: Credentials, p12_name: str) -> None:
    with pytest.raises(InvalidInput, match=r"^p12_name: "):
        write_profile(make_input(creds, "swanctl", p12_name=p12_name))


def test_a_powershell_apostrophe_is_doubled_and_a_typographic_quote_refused(creds: Credentials) -> None:
    script = write_profile(make_input(creds, "windows", name="Alice's VPN")).content.decode("utf-8-sig")
    assert "$Name = 'Alice''s VPN'" in script
    with pytest.raises(InvalidInput, match=r"^name: .*typographic quote"):
        write_profile(make_input(creds, "windows", name="Alice\u2019s VPN"))


def test_a_swanctl_double_quote_is_escaped_and_reads_back(creds: Credentials) -> None:
    local_id = 'CN=a "quoted" \\ name'
    conf = parse_swanctl(write_profile(make_input(creds, "swanctl", local_id=local_id)).content.decode("utf-8"))
    assert conf["connections"]["qoss-target-1"]["local"]["id"] == local_id  # type: ignore[index]


def test_a_keyfile_refuses_a_backslash(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^local_id: .*backslash"):
        write_profile(make_input(creds, "networkmanager", local_id="CN=a\\,b"))


def test_a_domain_must_be_a_dns_name(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^domains: "):
        write_profile(make_input(creds, "apple", domains=("corp.example\n",)))


# --------------------------------------------------------------------------- what Apple's client needs


def test_apple_refuses_a_distinguished_name_as_local_id(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^local_id: .*distinguished name"):
        write_profile(make_input(creds, "apple", local_id=f"CN={DEVICE}"))


def test_apple_needs_local_id_among_the_certificates_alt_names(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^local_id: .*subjectAltName"):
        write_profile(make_input(creds, "apple", local_id="someone.else"))


def test_apple_needs_the_device_certificate(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^device_cert_der: "):
        write_profile(make_input(creds, "apple", device_cert_der=None))


def test_apple_refuses_a_pkcs12_it_cannot_open(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^p12: .*PBES2"):
        write_profile(make_input(creds, "apple", p12=creds.p12))


def test_a_device_certificate_from_another_ca_is_refused(creds: Credentials) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, DEVICE)])
    now = datetime.now(UTC)
    stranger = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(1).not_valid_before(now).not_valid_after(now + timedelta(days=1))
                .sign(key, hashes.SHA256()))
    with pytest.raises(InvalidInput, match=r"^device_cert_der: not issued by the CA"):
        write_profile(make_input(creds, "swanctl", device_cert_der=stranger.public_bytes(serialization.Encoding.DER)))


def test_the_profile_uuid_is_checked_and_kept(creds: Credentials) -> None:
    with pytest.raises(InvalidInput, match=r"^uuid: "):
        write_profile(make_input(creds, "android", uuid="not-a-uuid"))
    fresh = str(uuid.uuid4())
    assert json.loads(write_profile(make_input(creds, "android", uuid=fresh)).content)["uuid"] == fresh
