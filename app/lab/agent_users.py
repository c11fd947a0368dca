"""A user of the agent lab: enrolled at Host (key pair and client config made on the way), and
joining from the client's namespace with ``qoss agent connect``, then pinging Target's
protected address through the tunnel, with what the client's charon saw of it."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from app.adapters.agent.crypto import KeyPair, load_public, write_keys
from app.adapters.vici import IkeSa
from app.domain.errors import AlreadyExists, GatewayError
from app.lab.agent import HOST_ID, TARGET_ID, AgentLab, AgentLabError
from app.lab.agent_configs import client_config, write_config
from app.lab.processes import private_umask

__all__ = ["ALL_OBJECTIVES", "charon_suite", "device", "enroll", "join", "revoke_devices"]

#: What a lab user is enrolled for: every Objective-ID (Target refuses what it cannot give).
ALL_OBJECTIVES = (1, 2, 3, 4)
_USER = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


def charon_suite(sa: IkeSa) -> dict[str, str]:
    """The suite of an IKE_SA and its first CHILD_SA as charon reports it, written as
    ``swanctl --list-sas`` does (``AES_CBC-128/HMAC_SHA2_256_128/PRF_HMAC_SHA2_256/CURVE_25519``,
    ``ESP:AES_GCM_16-128``)."""

    def alg(name: str | None, keysize: int | None) -> str | None:
        return None if name is None else f"{name}-{keysize}" if keysize else name

    ike = "/".join(p for p in (alg(sa.encr_alg, sa.encr_keysize), sa.integ_alg, sa.prf_alg, sa.dh_group) if p)
    out = {"ike": ike}
    if sa.children:
        child = sa.children[0]
        parts = (alg(child.encr_alg, child.encr_keysize), child.integ_alg, child.dh_group)
        out["child"] = f"{child.protocol}:" + "/".join(p for p in parts if p)
    return out


def enroll(lab: AgentLab, user: str, objectives: Sequence[int] = ALL_OBJECTIVES) -> bool:
    """Make the user's key pair and client config if missing, and enrol the user at Host.

    Returns:
        Whether the user was enrolled now (False: enrolled already).

    Raises:
        AgentLabError: no lab is up, or the name is not a user name.
    """
    from app.adapters.db.agent import UserRepository
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for
    from app.domain.agent import EnrolledUser
    from app.settings import Settings

    if not lab.state_file.exists():
        raise AgentLabError(f"no agent lab is up in {lab.state_dir} (qoss lab up --agent)")
    if not _USER.match(user) or user in (HOST_ID, TARGET_ID):
        raise AgentLabError(f"{user!r} is not a user name (a-z, 0-9, . _ -; not {HOST_ID} or {TARGET_ID})")
    if not lab.public_key_file(user).exists():
        with private_umask():
            write_keys(KeyPair.generate(user), lab.key_dir)
    path = lab.client_config_path(user)
    if not path.exists():
        client = lab.host("client")
        write_config(path, client_config(
            user=user, key_dir=lab.key_dir, host_id=TARGET_ID if lab.combined else HOST_ID,
            host_url=lab.url(lab.host_server), host_key=lab.public_key_file(TARGET_ID if lab.combined else HOST_ID),
            targets={TARGET_ID: lab.public_key_file(TARGET_ID)}, vici_socket=client.vici_socket,
            state_dir=lab.state_dir / f"client-{user}", ike_address=client.gateway_ike_address), client=True)
    _, keys = load_public(lab.public_key_file(user))
    engine = engine_for(Settings(database_url=lab.database_url(lab.host_server)))
    try:
        with make_session_factory(engine)() as session, session.begin():
            UserRepository(session).enroll(EnrolledUser(user_id=user, sign_public_key=keys.sign,
                                                        kem_public_key=keys.kem, mlkem_public_key=keys.mlkem,
                                                        objectives=frozenset(objectives)))
        enrolled = True
    except AlreadyExists:
        enrolled = False
    finally:
        engine.dispose()
    lab.record_user(user)
    return enrolled

def join(lab: AgentLab, user: str, *, objective: int = 3, min_levels: Mapping[str, int] | None = None,
         pings: int = 3) -> dict[str, Any]:
    """Enrol ``user`` if needed, connect through the agent from the client's namespace, and ping
    Target's protected address of the virtual IP's family from the virtual IP.

    Returns:
        ``user``, ``enrolled`` (now), ``virtual_ip``, ``suite`` (as the client's charon
        reports it), ``proposals`` (what Target negotiated), ``ticket``, ``conn``, ``ping``
        (``crossed``: replies came back and the CHILD_SA counted them), ``client_config``.

    Raises:
        AgentLabError: no lab is up, or the connect failed (the message is the client's).
    """
    enrolled = enroll(lab, user)
    args = ["connect", "--target", TARGET_ID, "--objective", str(objective)]
    for level, value in (min_levels or {}).items():
        args += [f"--{level.replace('_', '-')}", str(value)]
    done = lab.agent(user, *args, check=False)
    if done.returncode != 0:
        raise AgentLabError(f"{user} could not connect: {_client_error(done.stderr)}")
    report = json.loads(done.stdout)
    result: dict[str, Any] = {
        "user": user, "enrolled": enrolled, "virtual_ip": report.get("virtual_ip"),
        "suite": None, "proposals": {"ike": report.get("ike_proposal"), "esp": report.get("esp_proposal")},
        "protection": report.get("protection"), "ticket": report.get("ticket"), "conn": report.get("conn"),
        "ping": None, "client_config": str(lab.client_config_path(user)),
    }
    if report.get("conn") is None or report.get("virtual_ip") is None:
        return result  # Target granted no tunnel (native protection)
    gateway = lab.host("client").gateway(10.0)
    try:
        before = gateway.list_sas(ike=report["conn"])
        target = _inside_address(lab, report["virtual_ip"])
        result["ping"] = _ping(lab, report["virtual_ip"], target, pings)
        after = gateway.list_sas(ike=report["conn"])
    except GatewayError as exc:
        raise AgentLabError(f"cannot read the client's charon: {exc.message}") from exc
    if after:
        result["suite"] = charon_suite(after[0])
    counts = [(c.packets_out, c.packets_in) for sa in (before[:1] + after[:1]) for c in sa.children[:1]]
    if len(counts) == 2:
        out, back = counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]
        result["ping"]["esp_packets"] = {"out": out, "in": back}
        received = result["ping"]["received"]
        result["ping"]["crossed"] = received > 0 and out >= received and back >= received
    return result

def device(lab: AgentLab, user: str, *, platform: str, out_dir: str, objective: int = 3,
           min_levels: Mapping[str, int] | None = None, link: bool = False) -> dict[str, Any]:
    """Enrol ``user`` if needed and enrol a device of theirs through the lab's Host and Target as
    the user would (``qoss agent device enrol`` in the client's namespace): the profile for
    ``platform`` and its files go into ``out_dir``; with ``link``, the profile also waits at Host
    for one download (``link`` in the report: reachable from the lab's namespaces).

    Returns:
        The client's report: ``profile`` (its path), ``passphrase`` (the PKCS#12's, shown once),
        ``ticket``, ``platform``, the proposals, the gateway's address and identity, ``files``.

    Raises:
        AgentLabError: no lab is up, or Target refused (the message is Target's).
    """
    enroll(lab, user)
    args = ["device", "enrol", "--target", TARGET_ID, "--platform", platform, "--objective", str(objective),
            "--out", out_dir]
    for level, value in (min_levels or {}).items():
        args += [f"--{level.replace('_', '-')}", str(value)]
    if link:
        args.append("--link")
    done = lab.agent(user, *args, check=False)
    if done.returncode != 0:
        raise AgentLabError(f"{user} could not enrol a device: {_client_error(done.stderr)}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def revoke_devices(lab: AgentLab, user: str) -> list[str]:
    """Revoke every device ``user`` enrolled in the lab: the tickets revoked.

    Raises:
        AgentLabError: no such user, or a revocation failed.
    """
    if not lab.client_config_path(user).exists():
        raise AgentLabError(f"{user!r} has no client config in the lab (enrol a device first)")
    listed = lab.agent(user, "device", "list", "--offline", check=False)
    if listed.returncode != 0:
        raise AgentLabError(f"cannot list {user}'s devices: {_client_error(listed.stderr)}")
    revoked = []
    for record in json.loads(listed.stdout):
        done = lab.agent(user, "device", "revoke", str(record["ticket"]), check=False)
        if done.returncode != 0:
            raise AgentLabError(f"could not revoke {record['ticket']}: {_client_error(done.stderr)}")
        revoked.append(str(record["ticket"]))
    return revoked


def _inside_address(lab: AgentLab, virtual_ip: str) -> str:
    """Target's inside address of ``virtual_ip``'s family (``10.3.0.1``, ``fd03::1``)."""
    target = lab.host("target")
    if ":" in virtual_ip and target.inside_address6 is not None:
        return target.inside_address6
    return target.inside_address


def _ping(lab: AgentLab, source: str, destination: str, count: int) -> dict[str, Any]:
    done = subprocess.run(
        ["ip", "netns", "exec", lab.host("client").netns, "ping", "-n", "-q", "-c", str(count), "-i", "0.2",
         "-W", "2", "-I", source, destination],
        capture_output=True, text=True, timeout=10 + 3 * count, check=False, env=lab.env(),
    )
    sent = re.search(r"(\d+) packets transmitted, (\d+) received", done.stdout)
    rtt = re.search(r"= [\d.]+/([\d.]+)/", done.stdout)
    return {"from": source, "to": destination, "transmitted": int(sent.group(1)) if sent else count,
            "received": int(sent.group(2)) if sent else 0, "rtt_avg_ms": float(rtt.group(1)) if rtt else None,
            "crossed": False}


def _client_error(stderr: str) -> str:
    """The client's error in one line (``qoss agent`` prints a JSON error document)."""
    text = stderr.strip()
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        doc = json.loads(text)
        detail = doc.get("detail")
        message = detail.get("message") if isinstance(detail, dict) else detail
        return f"{doc.get('error')}: {message}"
    lines = text.splitlines()
    return lines[-1] if lines else "no message"
