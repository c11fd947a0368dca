"""The agent configs a lab writes: Host's and Target's roles, a server's config playing one or
both, a client's config, and writing one as YAML checked by the loader qoss itself uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from app.lab.processes import write_private
from app.services.agent.config import load_client_config, load_server_config

__all__ = ["client_config", "host_role", "server_config", "target_role", "write_config"]


def host_role(targets: Mapping[str, tuple[str, Path]]) -> dict[str, Any]:
    """The Host role: the targets it trusts, by id, as (URL or ``"local"``, public key file)."""
    return {"targets": {name: {"url": url, "public_key_file": str(pub)} for name, (url, pub) in targets.items()}}


def target_role(*, hosts: Mapping[str, Path], vici_socket: str, ike_address: str, protected: Sequence[str],
                pool: str, pool6: str | None = None, sweep_interval: float = 1.0) -> dict[str, Any]:
    """The Target role: the hosts it trusts (id -> public key file), its charon, what it protects, its
    pool (and an IPv6 ``pool6`` beside an IPv4 pool)."""
    return {"hosts": {name: {"public_key_file": str(pub)} for name, pub in hosts.items()},
            "vici_socket": vici_socket, "ike_address": ike_address, "protected": list(protected), "pool": pool,
            **({"pool6": pool6} if pool6 is not None else {}), "sweep_interval": sweep_interval}


def server_config(*, id: str, key_dir: Path, host: Mapping[str, Any] | None = None,
                  target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A server's agent config (``QOSS_AGENT_CONFIG``) playing Host, Target or both."""
    config: dict[str, Any] = {"id": id, "key_dir": str(key_dir)}
    if host is not None:
        config["host"] = dict(host)
    if target is not None:
        config["target"] = dict(target)
    return config


def client_config(*, user: str, key_dir: Path, host_id: str, host_url: str, host_key: Path,
                  targets: Mapping[str, Path], vici_socket: str, state_dir: Path,
                  ike_address: str | None = None) -> dict[str, Any]:
    """A client's agent config (``qoss agent ... --config``)."""
    config: dict[str, Any] = {
        "user": user, "key_dir": str(key_dir),
        "host": {"id": host_id, "url": host_url, "public_key_file": str(host_key)},
        "targets": {name: {"public_key_file": str(pub)} for name, pub in targets.items()},
        "vici_socket": vici_socket, "state_dir": str(state_dir),
    }
    if ike_address is not None:
        config["ike_address"] = ike_address
    return config


def write_config(path: Path, config: Mapping[str, Any], *, client: bool = False) -> Path:
    """Write an agent config as YAML and read it back with the loader qoss uses (which checks it).

    Raises:
        InvalidInput: the config is not valid.
    """
    write_private(path, yaml.safe_dump(dict(config), sort_keys=False))
    if client:
        load_client_config(path)
    else:
        load_server_config(path)
    return path
