"""docker-compose.yml cannot run here (no Docker engine): keep it valid and consistent."""

from __future__ import annotations

import re

import yaml

from tests import REPO_ROOT


def test_compose_has_postgres_api_and_two_gateways() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"postgres", "api", "gw-left", "gw-right"}
    assert compose["services"]["api"]["ports"] == ["127.0.0.1:8000:8000"]


def test_gateway_vici_sockets_reach_the_api_through_volumes() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    conf = (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()
    (socket,) = re.findall(r"socket = unix://(\S+)", conf)
    api_volumes = dict(v.split(":") for v in compose["services"]["api"]["volumes"])
    for side in ("left", "right"):
        (gw_volume,) = compose["services"][f"gw-{side}"]["volumes"]
        name, mount = gw_volume.split(":")
        assert socket.startswith(mount + "/")
        assert api_volumes[name] == f"/var/run/qoss/{side}"
    assert "/var/run/qoss" in compose["services"]["api"]["environment"]["QOSS_VICI_SOCKET_DIRS"]


def test_dockerfiles_copy_only_what_exists() -> None:
    for dockerfile in (REPO_ROOT / "Dockerfile", REPO_ROOT / "deploy/strongswan/Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (dockerfile.parent / src).exists(), f"{dockerfile}: {src}"
