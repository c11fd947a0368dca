"""Device profiles: the file a phone's or laptop's own IKEv2 client imports, with the negotiated suite.

One writer per platform, a module of this package, each in the format the client reads; a
platform's record (``app.domain.agent.platforms.PLATFORMS``) names its writer, media type and files:

- android: ``<name>.sswan``, ``application/vnd.strongswan.profile``; the CA and the PKCS#12 inside.
- apple: ``<name>.mobileconfig``, ``application/x-apple-aspen-config``; the CA and the PKCS#12 inside.
- windows: ``<name>.ps1``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and the CA (DER).
- networkmanager: ``<name>.nmconnection``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and
  the CA (PEM).
- swanctl: ``<name>.conf``, ``text/plain; charset=utf-8``; beside it the PKCS#12 and the CA (PEM).

``<name>`` is the connection name reduced to letters, digits, ``_`` and ``-``. The PKCS#12
passphrase never reaches a writer: every client asks the user for it.

Every writer reads its own output back (JSON, plist, INI, the PowerShell lines, swanctl.conf) and
refuses to hand it out unless the suite, the identities and the networks come back unchanged: a
guard against bugs here, not against the input. Input is checked first: a value that could break
the format (a newline, a quote the format cannot hold) raises ``InvalidInput`` naming the field;
a suite the platform cannot name raises :class:`Inexpressible` and nothing is written.

Errors::

    InvalidInput (ValueError)      a field that cannot go into the profile (app.domain.errors)
    Inexpressible (ValueError)     the platform cannot say the suite (app.domain.agent.platforms)
    RuntimeError                   a profile that does not read back as written (a bug here)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from app.adapters.agent.profiles import android, apple, networkmanager, swanctl, windows
from app.adapters.agent.profiles.common import Checked, DeviceProfileInput, Profile, check
from app.adapters.agent.profiles.networkmanager import NM_DIRECTORY
from app.adapters.agent.profiles.swanctl import parse_swanctl
from app.domain.agent.platforms import Inexpressible
from app.domain.errors import InvalidInput

__all__ = ["NM_DIRECTORY", "DeviceProfileInput", "Inexpressible", "Profile", "parse_swanctl", "write_profile"]

#: The profile writers, by the key a platform's record names.
_WRITERS: Mapping[str, Callable[[Checked], Profile]] = MappingProxyType({
    "sswan": android.write,
    "mobileconfig": apple.write,
    "powershell": windows.write,
    "nmconnection": networkmanager.write,
    "swanctl": swanctl.write,
})


def write_profile(inp: DeviceProfileInput) -> Profile:
    """The platform's profile for one device, with the negotiated suite in the platform's names.

    On-demand ``domains`` are written for Apple only: an ``EvaluateConnection`` rule that
    connects when one of them does not resolve outside the tunnel (Apple's rules cannot match a
    destination address, so ``remote_ts`` alone starts nothing; without domains the user connects
    by hand). Windows starts a connection for a DNS suffix only when the trigger names the
    suffix's DNS servers, which the input does not carry, and the strongSwan clients have no
    trigger: their profiles leave the domains out.

    Raises:
        InvalidInput: a field that cannot be used (the message names it).
        Inexpressible: the platform cannot say the suite; no profile is written.
    """
    if not isinstance(inp, DeviceProfileInput):
        raise InvalidInput(f"expected a DeviceProfileInput, not {type(inp).__name__}")
    checked = check(inp)
    return _WRITERS[checked.platform.writer](checked)
