"""strongSwan's own profile: a swanctl.conf road warrior (and the same connection with charon-cmd)."""

from __future__ import annotations

import base64
import re
import shlex

from app.adapters.agent.profiles.common import Checked, Profile, ca_file_name, ca_pem, profile, proposals, round_trip
from app.domain.agent.platforms import LABELS

__all__ = ["parse_swanctl", "write"]


def write(checked: Checked) -> Profile:
    """A swanctl.conf road warrior (strongSwan's swanctl.conf(5)): a virtual IP, the proposals and
    lifetimes, public-key authentication both ways. ``local`` names only the identity: charon
    takes the certificate for it, and its key, from the PKCS#12 that ``swanctl --load-creds`` loads
    from ``/etc/swanctl/pkcs12/`` (asking for the passphrase, which is why the file has no
    ``secrets`` entry for it). ``remote`` trusts the CA file in ``/etc/swanctl/x509ca/``. The header
    also shows the same connection with charon-cmd.

    With a PPK (RFC 8784), the connection has ``ppk_id`` and ``ppk_required = yes`` and the file a
    ``secrets`` section with the PPK under that id (strongSwan 5.7 and later); charon-cmd has no
    PPK option, so the header says to use swanctl. The file is then as secret as the PPK."""
    inp = checked.inp
    name = checked.stem
    ca_file = ca_file_name(checked)
    ike, esp = proposals(checked)
    vips = ",".join(vip for vip, version in (("0.0.0.0", 4), ("::", 6))  # noqa: S104 - asks for any virtual IP
                    if any(n.version == version for n in checked.networks))
    conn: dict[str, object] = {
        "version": "2",
        "remote_addrs": inp.remote_address,
        "vips": vips,
        "proposals": ike,
        "rekey_time": f"{inp.ike_lifetime}s",
        "local": {"auth": "pubkey", "id": inp.local_id},
        "remote": {"auth": "pubkey", "id": inp.remote_id, "cacerts": ca_file},
        "children": {name: {
            "remote_ts": ",".join(str(n) for n in checked.networks),
            "esp_proposals": esp,
            "rekey_time": f"{inp.child_lifetime}s",
            "life_time": f"{inp.child_lifetime + inp.child_lifetime // 10}s",
            "start_action": "none",
        }},
    }
    document: dict[str, object] = {"connections": {name: conn}}
    if inp.ppk is not None and inp.ppk_id is not None:
        conn["ppk_id"] = inp.ppk_id
        conn["ppk_required"] = "yes"
        document["secrets"] = {f"ppk-{name}": {"id": inp.ppk_id,
                                               "secret": "0s" + base64.b64encode(inp.ppk).decode("ascii")}}
    charon_cmd = shlex.join([
        "charon-cmd", "--host", inp.remote_address, "--identity", inp.local_id, "--remote-identity", inp.remote_id,
        "--cert", ca_file, "--p12", inp.p12_name, "--ike-proposal", ike,
        "--esp-proposal", esp, *(a for n in checked.networks for a in ("--remote-ts", str(n))),
        "--profile", "ikev2-pub"])
    header = [
        f"# {inp.name}: {LABELS['swanctl']} profile.",
        f"# Put {inp.p12_name} into /etc/swanctl/pkcs12/, {ca_file} into /etc/swanctl/x509ca/ and this file",
        "# into /etc/swanctl/conf.d/, then run `swanctl --load-all` (it asks for the PKCS#12 passphrase)",
        f"# and `swanctl --initiate --child {name}`.",
    ]
    if inp.ppk is None:
        header += ["# With charon-cmd instead, in the folder of the files:", f"#   {charon_cmd}"]
    else:
        header += ["# This file holds the connection's post-quantum preshared key (PPK): keep it readable by",
                   "# root alone. charon-cmd has no PPK option: this connection needs swanctl."]
    text = "\n".join(header) + "\n" + "".join(_swanctl_section(k, v, 0) for k, v in document.items())
    round_trip(parse_swanctl(text) == document, "swanctl", "swanctl.conf")
    files = {inp.p12_name: inp.p12, ca_file: ca_pem(checked)}
    return profile(checked, text.encode("utf-8"), files)


def _swanctl_section(name: str, body: object, depth: int) -> str:
    indent = "    " * depth
    if isinstance(body, dict):
        inner = "".join(_swanctl_section(k, v, depth + 1) for k, v in body.items())
        return f"{indent}{name} {{\n{inner}{indent}}}\n"
    return f"{indent}{name} = {_swanctl_quote(str(body))}\n"


def _swanctl_quote(value: str) -> str:
    """A quoted swanctl.conf value: a backslash and a double quote are escaped with a backslash."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SWANCTL_TOKEN = re.compile(r'[ \t\r]*(?:#[^\n]*|([{}=\n])|"((?:[^"\\\n]|\\.)*)"|([^\s#{}="]+))')


def parse_swanctl(text: str) -> dict[str, object]:
    """Read the subset of swanctl.conf that :func:`write` writes: nested ``name { ... }``
    sections and ``key = value`` lines, values bare or double-quoted (with backslash escapes),
    ``#`` comments.

    Raises:
        ValueError: text outside that subset.
    """
    tokens = _swanctl_tokens(text)
    document, end = _swanctl_body(tokens, 0)
    if end != len(tokens):
        raise ValueError("swanctl.conf: a '}' closes no section")
    return document


def _swanctl_tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        match = _SWANCTL_TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"swanctl.conf: cannot read {text[pos:pos + 20]!r}")
            break
        punct, quoted, bare = match.groups()
        if punct is not None:
            tokens.append(("punct", punct))
        elif quoted is not None:
            tokens.append(("value", re.sub(r"\\(.)", r"\1", quoted)))
        elif bare is not None:
            tokens.append(("value", bare))
        pos = match.end()
    return tokens


def _swanctl_body(tokens: list[tuple[str, str]], pos: int) -> tuple[dict[str, object], int]:
    body: dict[str, object] = {}
    while pos < len(tokens):
        kind, value = tokens[pos]
        if (kind, value) == ("punct", "\n"):
            pos += 1
            continue
        if (kind, value) == ("punct", "}"):
            return body, pos
        if kind != "value" or pos + 1 >= len(tokens):
            raise ValueError(f"swanctl.conf: expected a name, found {value!r}")
        follow = tokens[pos + 1]
        if follow == ("punct", "{"):
            inner, pos = _swanctl_body(tokens, pos + 2)
            if pos >= len(tokens) or tokens[pos] != ("punct", "}"):
                raise ValueError(f"swanctl.conf: section {value!r} is not closed")
            body[value] = inner
            pos += 1
        elif follow == ("punct", "="):
            pos += 2
            words: list[str] = []  # a value runs to the end of its line
            while pos < len(tokens) and tokens[pos][0] == "value":
                words.append(tokens[pos][1])
                pos += 1
            body[value] = " ".join(words)
        else:
            raise ValueError(f"swanctl.conf: expected '{{' or '=' after {value!r}")
    return body, pos
