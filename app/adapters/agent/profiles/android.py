"""The strongSwan VPN Client for Android's profile: a ``.sswan`` file that holds everything."""

from __future__ import annotations

import base64
import json

from app.adapters.agent.profiles.common import Checked, Profile, ca_der, profile, proposals, round_trip

__all__ = ["write"]


def write(checked: Checked) -> Profile:
    """The strongSwan app's ``.sswan`` JSON (docs.strongswan.org, "VPN Profile Import for the
    Android VPN Client"): certificate authentication, the CA and the PKCS#12 embedded (the app asks
    for the passphrase on import), the proposals, and the split tunnel's networks. The app has no
    lifetime setting: the gateway's rekeying governs."""
    inp = checked.inp
    ike, esp = proposals(checked)
    document = {
        "uuid": inp.uuid.lower(),
        "name": inp.name,
        "type": "ikev2-cert",
        "remote": {"addr": inp.remote_address, "id": inp.remote_id,
                   "cert": base64.b64encode(ca_der(checked)).decode("ascii")},
        "local": {"id": inp.local_id, "p12": base64.b64encode(inp.p12).decode("ascii")},
        "ike-proposal": ike,
        "esp-proposal": esp,
        "split-tunneling": {"subnets": [str(n) for n in checked.networks], "block-ipv4": False, "block-ipv6": False},
    }
    content = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    read = json.loads(content)
    round_trip(read == document and base64.b64decode(read["local"]["p12"]) == inp.p12, "android", "JSON")
    return profile(checked, content)

