"""A lab host's charon: its ``strongswan.conf`` (kernel-libipsec, its own VICI socket and log
under the host's directory, two quick retransmits so that failing tests fail fast), started
in the host's network namespace and in a mount namespace of its own (a private tmpfs on
``/run``), and waited for until its VICI socket answers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from app.adapters.vici.gateway import ViciGateway
from app.domain.errors import GatewayError
from app.lab.processes import PRIVATE_UMASK, LabError, open_private_log, write_private

__all__ = ["CHARON", "start_charon", "wait_for_charon"]

CHARON = "/usr/lib/ipsec/charon"
#: Runs charon in a fresh mount namespace with a private /run. The script is constant:
#: the charon path arrives as ``$0``, the config through the environment.
_START_SCRIPT = 'mount -t tmpfs tmpfs /run && exec "$0"'


def _conf_text(host_dir: Path) -> str:
    return f"""# written by qoss lab
charon {{
  load_modular = yes
  # Every IKE_SA between two lab hosts comes from one address: charon's DoS protection would
  # drop the sixth set-up in flight from it (per-IP half-open limit) and, with the quick
  # retransmits below, concurrent set-ups would fail that a real deployment completes.
  dos_protection = no
  install_virtual_ip = yes
  retransmit_tries = 2
  retransmit_timeout = 1.0
  plugins {{
    include /etc/strongswan.d/charon/*.conf
    kernel-libipsec {{
      load = yes
      allow_peer_ts = yes
    }}
    vici {{
      socket = unix://{host_dir}/charon.vici
    }}
    stroke {{
      load = no
    }}
  }}
  filelog {{
    lab {{
      path = {host_dir}/charon.log
      time_format = %H:%M:%S
      flush_line = yes
      append = yes
      default = 1
      # cfg 2 would log every candidate config on each IKE_SA: O(conns) lines per set-up
      cfg = 1
      ike = 1
    }}
  }}
  syslog {{
    daemon {{
      default = -1
    }}
  }}
}}
"""


def start_charon(*, netns: str, host_dir: Path, conf: str, charon: str = CHARON) -> subprocess.Popen[bytes]:
    """Write ``conf`` (the host's ``strongswan.conf``) and start charon with it in ``netns``;
    its output goes to ``host_dir/charon.stderr``."""
    write_private(Path(conf), _conf_text(host_dir))
    with contextlib.suppress(FileNotFoundError):
        (host_dir / "charon.vici").unlink()
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "STRONGSWAN_CONF": conf}
    with open_private_log(host_dir / "charon.stderr") as err:
        return subprocess.Popen(
            ["ip", "netns", "exec", netns, "unshare", "-m", "--propagation", "private",
             "sh", "-c", _START_SCRIPT, charon],
            env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True, umask=PRIVATE_UMASK,
        )


def wait_for_charon(*, name: str, vici_socket: str, log_path: str, proc: subprocess.Popen[bytes] | None,
                    timeout: float) -> None:
    """Wait until the charon of host ``name`` answers on ``vici_socket``.

    Raises:
        LabError: ``proc`` exited, or charon did not answer within ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    gateway = ViciGateway(vici_socket, timeout=2.0)
    last = "not started"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LabError(f"charon on {name} exited with {proc.returncode}; see {log_path}")
        try:
            gateway.version()
            return
        except GatewayError as exc:
            last = exc.message
        time.sleep(0.05)
    raise LabError(f"charon on {name} did not answer within {timeout:g} s: {last}")
