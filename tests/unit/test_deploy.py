"""The container files stay consistent with each other and with the product. They are built
and run, with a tunnel through them, by scripts/compose-check.sh (docs/containers.md)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import yaml

from tests import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
DOCKERFILES = [REPO_ROOT / "Dockerfile", *sorted((REPO_ROOT / "deploy").glob("*/Dockerfile"))]


def test_compose_has_postgres_api_and_two_gateways() -> None:
    assert set(COMPOSE["services"]) == {"postgres", "api", "gw-left", "gw-right"}
    assert COMPOSE["services"]["api"]["ports"] == ["127.0.0.1:${QOSS_PORT:-8000}:8000"]


def test_gateway_vici_sockets_reach_the_api_through_volumes() -> None:
    conf = (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()
    (socket,) = re.findall(r"socket = unix://(\S+)", conf)
    api_volumes = dict(v.split(":") for v in COMPOSE["services"]["api"]["volumes"])
    for side in ("left", "right"):
        (gw_volume,) = COMPOSE["services"][f"gw-{side}"]["volumes"]
        name, mount = gw_volume.split(":")
        assert socket.startswith(mount + "/")
        assert api_volumes[name] == f"/var/run/qoss/{side}"
    assert "/var/run/qoss" in COMPOSE["services"]["api"]["environment"]["QOSS_VICI_SOCKET_DIRS"]


def test_pinned_addresses_are_in_the_network_and_none_is_its_gateway() -> None:
    (ipam,) = COMPOSE["networks"]["ike"]["ipam"]["config"]
    subnet, gateway = ipaddress.ip_network(ipam["subnet"]), ipaddress.ip_address(ipam["gateway"])
    pinned = [ipaddress.ip_address(s["networks"]["ike"]["ipv4_address"]) for s in COMPOSE["services"].values()]
    assert all(a in subnet for a in pinned)
    assert gateway not in pinned
    assert len(set(pinned)) == len(pinned)
    assert COMPOSE["services"]["api"]["environment"]["QOSS_DB_HOST"] == \
        COMPOSE["services"]["postgres"]["networks"]["ike"]["ipv4_address"]


def test_no_password_in_the_compose_file_or_the_images() -> None:
    assert COMPOSE["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    assert COMPOSE["services"]["api"]["environment"]["QOSS_DB_PASSWORD_FILE"].startswith("/run/secrets/")
    for text in [(REPO_ROOT / "docker-compose.yml").read_text(), *(d.read_text() for d in DOCKERFILES)]:
        assert not re.search(r"PASSWORD\s*[:=]\s*[^/\s$]", text)


def test_the_api_image_installs_only_from_the_lock() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r requirements/runtime.txt" in " ".join(text.replace("\\\n", " ").split())
    assert "--no-deps" in text


def test_the_gateway_image_has_the_vici_plugin_and_kernel_libipsec() -> None:
    text = (REPO_ROOT / "deploy/strongswan/Dockerfile").read_text()
    assert "strongswan-swanctl" in text  # the VICI plugin: without it there is no charon.vici
    assert "libcharon-extra-plugins" in text  # kernel-libipsec
    assert "load = yes" in (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()


def test_dockerfiles_copy_only_what_exists() -> None:
    for dockerfile in DOCKERFILES:
        context = REPO_ROOT if dockerfile.parent == REPO_ROOT else dockerfile.parent
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile}: {src}"


def test_entrypoints_are_executable() -> None:
    for script in [REPO_ROOT / "deploy/api/qoss-container", *Path(REPO_ROOT / "deploy").glob("*/*-entrypoint")]:
        assert script.stat().st_mode & 0o111, script
