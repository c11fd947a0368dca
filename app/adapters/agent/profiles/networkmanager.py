"""NetworkManager's profile: a keyfile for its strongSwan plugin (charon-nm)."""

from __future__ import annotations

import configparser
import io
import shlex
from pathlib import PurePosixPath

from app.adapters.agent.profiles.common import Checked, Profile, ca_file_name, ca_pem, profile, proposals, round_trip
from app.domain.agent.platforms import LABELS
from app.domain.errors import InvalidInput

__all__ = ["NM_DIRECTORY", "write"]

#: Where the keyfile expects the CA, the device certificate and its key (see the file's comments).
NM_DIRECTORY = PurePosixPath("/etc/NetworkManager/qoss")


def write(checked: Checked) -> Profile:
    """A NetworkManager keyfile for the strongSwan plugin (charon-nm, strongSwan 5.9.0 or later for
    ``remote-ts``). The plugin reads the device certificate (``usercert``, X.509 only) and its key
    (``userkey``) from separate files and cannot open a PKCS#12 file, so the keyfile names the two
    files the commands in its header unpack from the PKCS#12 (openssl asks for the passphrase, then
    for a new one for the key, which NetworkManager asks for when connecting). All under
    ``/etc/NetworkManager/qoss/<name>/``. The plugin has no lifetime setting: the gateway's
    rekeying governs."""
    inp = checked.inp
    for field in ("name", "remote_id", "local_id"):
        if "\\" in getattr(inp, field):
            raise InvalidInput(f"{field}: a keyfile reads a backslash as an escape")
    directory = NM_DIRECTORY / checked.stem
    ca_file = ca_file_name(checked)
    key_stem = inp.p12_name.rsplit(".", 1)[0]
    cert_path, key_path = directory / f"{key_stem}.crt", directory / f"{key_stem}.key"
    ike, esp = proposals(checked)
    keyfile = _keyfile()
    keyfile["connection"] = {"id": inp.name, "uuid": inp.uuid.lower(), "type": "vpn", "autoconnect": "false"}
    keyfile["vpn"] = {
        "service-type": "org.freedesktop.NetworkManager.strongswan",
        "address": inp.remote_address,
        "certificate": str(directory / ca_file),
        "remote-identity": inp.remote_id,
        "local-identity": inp.local_id,
        "method": "cert",
        "cert-source": "file",
        "usercert": str(cert_path),
        "userkey": str(key_path),
        "password-flags": "1",
        "virtual": "yes",
        "encap": "no",
        "ipcomp": "no",
        "proposal": "yes",
        "ike": ike,
        "esp": esp,
        "remote-ts": ";".join(str(n) for n in checked.networks),
    }
    for section, version in (("ipv4", 4), ("ipv6", 6)):
        routes = [n for n in checked.networks if n.version == version]
        keyfile[section] = {"method": "auto", "never-default": "true",
                            **{f"route{i}": str(n) for i, n in enumerate(routes, start=1)}}
    header = [
        f"# {inp.name}: {LABELS['networkmanager']} (strongSwan 5.9.0 or later).",
        "# The plugin cannot open a PKCS#12 file: unpack the device certificate and its key once, as root,",
        "# in the folder that holds this file (openssl asks for the PKCS#12 passphrase, then for a new one",
        "# for the key, which NetworkManager asks for when connecting):",
        f"#   install -d -m 0700 {shlex.quote(str(directory))}",
        f"#   install -m 0644 {shlex.quote(ca_file)} {shlex.quote(str(directory))}/",
        f"#   openssl pkcs12 -in {shlex.quote(inp.p12_name)} -clcerts -nokeys -out {shlex.quote(str(cert_path))}",
        f"#   openssl pkcs12 -in {shlex.quote(inp.p12_name)} -nocerts -out {shlex.quote(str(key_path))}",
        f"#   install -m 0600 {shlex.quote(checked.stem)}.nmconnection /etc/NetworkManager/system-connections/",
        "#   nmcli connection reload",
    ]
    body = _write_keyfile(keyfile)
    text = "\n".join(header) + "\n" + body
    _networkmanager_read_back(text, keyfile)
    files = {inp.p12_name: inp.p12, ca_file: ca_pem(checked)}
    return profile(checked, text.encode("utf-8"), files)


def _keyfile() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=("#",),
                                       inline_comment_prefixes=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # NetworkManager's keys are case-sensitive
    return parser


def _write_keyfile(keyfile: configparser.ConfigParser) -> str:
    out = io.StringIO()
    keyfile.write(out, space_around_delimiters=False)
    return out.getvalue()


def _networkmanager_read_back(text: str, keyfile: configparser.ConfigParser) -> None:
    read = _keyfile()
    read.read_string(text)
    same = {s: dict(read[s]) for s in read.sections()} == {s: dict(keyfile[s]) for s in keyfile.sections()}
    round_trip(same, "networkmanager", "keyfile")
