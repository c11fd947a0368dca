"""Windows' profile: a PowerShell script that sets up the built-in IKEv2 client."""

from __future__ import annotations

import re

from app.adapters.agent.profiles.common import Checked, Profile, ca_der, ca_file_name, profile, round_trip
from app.domain.agent.platforms import LABELS, check_names
from app.domain.errors import InvalidInput

__all__ = ["write"]

#: PowerShell ends a single-quoted string at any of these, not only at the ASCII apostrophe.
_PS_QUOTES = "\u2018\u2019\u201a\u201b"

_PS_SET = re.compile(r"^Set-VpnConnectionIPsecConfiguration -ConnectionName \$Name((?: -\w+ \w+)+) -Force$", re.M)
_PS_NAME = re.compile(r"^\$Name = '((?:[^']|'')*)'$", re.M)
_PS_ROUTE = re.compile(r"^Add-VpnConnectionRoute -ConnectionName \$Name -DestinationPrefix '([^']*)'$", re.M)


def write(checked: Checked) -> Profile:
    """A PowerShell script for the built-in client (Microsoft Learn, VpnClient and PKI modules),
    run as administrator beside its two files: the CA into ``LocalMachine\\Root`` (Windows' IKEv2
    client with machine certificates checks the gateway's chain in the computer's Trusted Root
    Certification Authorities and in no narrower store; the CA's name constraints and purposes,
    which Windows enforces down the chain, keep it to this VPN's names and to authentication), the PKCS#12 into
    ``LocalMachine\\My`` (it asks for the passphrase), the connection (machine certificate, split
    tunnel, one route per network), and the suite with ``Set-VpnConnectionIPsecConfiguration``.
    Windows has no lifetime setting and takes no remote identity: it checks the gateway's
    certificate against the server address. The script is UTF-8 with a byte order mark (Windows
    PowerShell 5.1 reads a file without one in the ANSI code page) and CRLF line ends."""
    inp = checked.inp
    ipsec = checked.suite["ipsec"]
    p12_file, ca_file = inp.p12_name, ca_file_name(checked)
    lines = [
        "#Requires -RunAsAdministrator",
        f"# {inp.name}: {LABELS['windows']} profile. Run it as administrator from the folder that",
        f"# holds {p12_file} and {ca_file}; it asks for the PKCS#12 passphrase.",
        "# Windows has no setting for the IKE SA and CHILD_SA lifetimes: the gateway rekeys them",
        f"# (IKE SA every {inp.ike_lifetime} s, CHILD_SA every {inp.child_lifetime} s).",
        "$ErrorActionPreference = 'Stop'",
        f"$Name = {_ps(inp.name, 'name')}",
        "# Windows checks the gateway's certificate against the computer's trusted roots only, so the",
        "# CA goes there; its name constraints and purposes limit it to this VPN's names and to TLS and",
        "# IKE authentication (no code signing, no other site).",
        f"Import-Certificate -FilePath (Join-Path $PSScriptRoot {_ps(ca_file, 'ca file')}) "
        "-CertStoreLocation 'Cert:\\LocalMachine\\Root' | Out-Null",
        f"Import-PfxCertificate -FilePath (Join-Path $PSScriptRoot {_ps(p12_file, 'p12_name')}) "
        "-CertStoreLocation 'Cert:\\LocalMachine\\My' "
        "-Password (Read-Host -AsSecureString -Prompt 'PKCS#12 passphrase') | Out-Null",
        "if (Get-VpnConnection -Name $Name -ErrorAction SilentlyContinue) { Remove-VpnConnection -Name $Name -Force }",
        f"Add-VpnConnection -Name $Name -ServerAddress {_ps(inp.remote_address, 'remote_address')} -TunnelType Ikev2 "
        "-AuthenticationMethod MachineCertificate -EncryptionLevel Required -SplitTunneling -Force",
        "Set-VpnConnectionIPsecConfiguration -ConnectionName $Name"
        + "".join(f" -{parameter} {value}" for parameter, value in ipsec.items()) + " -Force",
        *(f"Add-VpnConnectionRoute -ConnectionName $Name -DestinationPrefix '{n}'" for n in checked.networks),
    ]
    if inp.domains:
        lines += ["# Not started on demand: Windows starts a connection for a DNS suffix only when the trigger",
                  "# names the suffix's DNS servers (Add-VpnConnectionTriggerDnsConfiguration -DnsIPAddress)."]
    content = b"\xef\xbb\xbf" + ("\r\n".join(lines) + "\r\n").encode("utf-8")
    _windows_read_back(content, checked)
    files = {p12_file: inp.p12, ca_file: ca_der(checked)}
    return profile(checked, content, files)


def _ps(value: str, field: str) -> str:
    """A single-quoted PowerShell string: nothing in it is expanded; an apostrophe is doubled."""
    if any(quote in value for quote in _PS_QUOTES):
        raise InvalidInput(f"{field}: {value[:64]!r} holds a typographic quote, which PowerShell reads as a quote")
    return "'" + value.replace("'", "''") + "'"


def _windows_read_back(content: bytes, checked: Checked) -> None:
    text = content.decode("utf-8-sig").replace("\r\n", "\n")
    round_trip(content.startswith(b"\xef\xbb\xbf") and "\r" not in text, "windows", "encoding and line ends")
    name = _PS_NAME.search(text)
    sets = _PS_SET.findall(text)
    round_trip(name is not None and name.group(1).replace("''", "'") == checked.inp.name and len(sets) == 1,
                "windows", "connection name")
    pairs = re.findall(r" -(\w+) (\w+)", sets[0])
    params = dict(pairs)
    round_trip(len(params) == len(pairs) and params == checked.suite["ipsec"], "windows", "IPsec parameters")
    check_names("windows", {"ipsec": params})
    round_trip(_PS_ROUTE.findall(text) == [str(n) for n in checked.networks], "windows", "routes")
