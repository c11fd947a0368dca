"""The container files stay consistent with each other and with the product. They are built
and run, with a tunnel through them, by scripts/compose-check.sh (docs/containers.md)."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import podman_compose
import pytest
import yaml

from tests import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
CHECK = (REPO_ROOT / "scripts/compose-check.sh").read_text()
BASE_BUILDER = (REPO_ROOT / "deploy/base/build-base.sh").read_text()
DOCKERFILES = [REPO_ROOT / "Dockerfile", *sorted((REPO_ROOT / "deploy").glob("*/Dockerfile"))]
GATEWAYS = ("gw-left", "gw-right")


def _dockerfile(service: str) -> Path:
    build = SERVICES[service]["build"]
    return Path(REPO_ROOT, build["context"], build.get("dockerfile", "Dockerfile"))


def _joined(text: str) -> str:
    """A Dockerfile or script with its continuation lines joined and its spaces squeezed."""
    return " ".join(text.replace("\\\n", " ").split())


def test_compose_has_postgres_api_and_two_gateways() -> None:
    assert set(SERVICES) == {"postgres", "api", *GATEWAYS}
    assert SERVICES["api"]["ports"] == ["127.0.0.1:${QOSS_PORT:-8000}:8000"]  # loopback only
    assert set(SERVICES["api"]["depends_on"]) == {"postgres", *GATEWAYS}


def test_every_image_builds_from_the_one_base_argument() -> None:
    for name, service in SERVICES.items():
        assert _dockerfile(name).is_file(), name
        assert service["build"]["args"] == {"BASE": "${QOSS_BASE_IMAGE:-debian:bookworm-slim}"}, name
    for dockerfile in DOCKERFILES:
        lines = [line for line in dockerfile.read_text().splitlines() if line and not line.startswith("#")]
        froms = [line for line in lines if line.startswith("FROM ")]
        if dockerfile.parent.name == "base":  # the base itself: the root file system mmdebstrap made
            assert froms == ["FROM ${ROOTFS}"]
            continue
        assert lines[0] == "ARG BASE=debian:bookworm-slim", dockerfile
        assert froms == ["FROM ${BASE}"], dockerfile


def test_the_check_builds_each_compose_image_from_its_context() -> None:
    built = dict(re.findall(r"^build (localhost/\S+) (\S+)", CHECK, re.MULTILINE))
    for name, service in SERVICES.items():
        assert built[service["image"]] == service["build"]["context"], name
    assert set(built) == {s["image"] for s in SERVICES.values()}


def test_the_check_and_the_base_builder_agree_on_the_base_image() -> None:
    (default,) = re.findall(r"base=\$\{QOSS_BASE_IMAGE:-(\S+)\}", CHECK)
    assert f"image=${{1:-{default}}}" in BASE_BUILDER
    assert 'bash deploy/base/build-base.sh "$base"' in CHECK


def test_the_base_comes_from_this_machines_apt_sources_only() -> None:
    assert "/etc/apt/sources.list" in BASE_BUILDER
    assert not re.search(r"https?://", BASE_BUILDER), "no mirror is hard-coded: apt's own sources name it"
    assert set(re.findall(r"https?://([^/:\s\"']+)", CHECK)) == {"127.0.0.1"}  # the API, on loopback


def test_gateway_vici_sockets_reach_the_api_through_volumes() -> None:
    conf = (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()
    (socket,) = re.findall(r"socket = unix://(\S+)", conf)
    api_volumes = dict(v.split(":") for v in SERVICES["api"]["volumes"])
    for side in ("left", "right"):
        (gw_volume,) = SERVICES[f"gw-{side}"]["volumes"]
        name, mount = gw_volume.split(":")
        assert socket == f"{mount}/charon.vici"
        assert api_volumes[name] == f"/var/run/qoss/{side}"
        assert "/var/run/qoss/$side/charon.vici" in CHECK  # what the check registers
    assert SERVICES["api"]["environment"]["QOSS_VICI_SOCKET_DIRS"] == '["/var/run/qoss"]'


def test_pinned_addresses_are_in_the_network_and_none_is_its_gateway() -> None:
    (ipam,) = COMPOSE["networks"]["ike"]["ipam"]["config"]
    subnet, gateway = ipaddress.ip_network(ipam["subnet"]), ipaddress.ip_address(ipam["gateway"])
    assert subnet.is_private
    pinned = [ipaddress.ip_address(s["networks"]["ike"]["ipv4_address"]) for s in SERVICES.values()]
    assert len(pinned) == len(SERVICES)  # every service is pinned
    assert all(a in subnet and a not in (subnet.network_address, subnet.broadcast_address) for a in pinned)
    assert gateway in subnet
    assert gateway not in pinned
    assert len(set(pinned)) == len(pinned)
    assert SERVICES["api"]["environment"]["QOSS_DB_HOST"] == SERVICES["postgres"]["networks"]["ike"]["ipv4_address"]


def test_gateways_have_tun_net_admin_and_distinct_inside_addresses_off_the_network() -> None:
    (ipam,) = COMPOSE["networks"]["ike"]["ipam"]["config"]
    subnet = ipaddress.ip_network(ipam["subnet"])
    inside = [ipaddress.ip_address(SERVICES[g]["environment"]["INSIDE_ADDRESS"]) for g in GATEWAYS]
    assert len(set(inside)) == 2
    assert all(a not in subnet for a in inside)
    for gateway in GATEWAYS:
        assert SERVICES[gateway]["cap_add"] == ["NET_ADMIN"]
        assert SERVICES[gateway]["devices"] == ["/dev/net/tun:/dev/net/tun"]
        assert SERVICES[gateway]["image"] == SERVICES["gw-left"]["image"]


def test_no_password_in_the_compose_file_or_the_images() -> None:
    assert COMPOSE["secrets"] == {"qoss_pg_password": {"external": True}}  # podman secret create, never a file
    for service in ("postgres", "api"):
        (secret,) = SERVICES[service]["secrets"]
        assert (secret["source"], secret["target"]) == ("qoss_pg_password", "pg_password")
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/pg_password"
    assert SERVICES["api"]["environment"]["QOSS_DB_PASSWORD_FILE"] == "/run/secrets/pg_password"
    for text in [(REPO_ROOT / "docker-compose.yml").read_text(), *(d.read_text() for d in DOCKERFILES)]:
        assert not re.search(r"PASSWORD\s*[:=]\s*[^/\s$]", text)


def _api_user_ids() -> tuple[str, str]:
    joined = _joined((REPO_ROOT / "Dockerfile").read_text())
    (gid,) = re.findall(r"groupadd --system --gid (\d+) qoss\b(?!-)", joined)
    (uid,) = re.findall(r"useradd --system --uid (\d+) --gid qoss\b", joined)
    return uid, gid


def _podman_run_secret(service: str) -> list[str]:
    """The --secret arguments podman-compose (the locked one) gives `podman run` for SERVICE."""
    compose = SimpleNamespace(declared_secrets=COMPOSE["secrets"], dirname=str(REPO_ROOT))
    container = {"_service": service, **SERVICES[service]}
    return [arg for secret in SERVICES[service]["secrets"]
            for arg in podman_compose.get_secret_args(compose, container, secret)]


def test_the_password_is_the_api_users_alone_in_its_container() -> None:
    uid, gid = _api_user_ids()
    (secret,) = SERVICES["api"]["secrets"]
    assert (secret["uid"], secret["gid"], secret["mode"]) == (uid, gid, "0400")
    # podman reads mode as octal digits: the string "0400", never YAML's integer 0400 (256).
    want = f"qoss_pg_password,uid={uid},gid={gid},mode=0400,target=pg_password"
    assert _podman_run_secret("api") == ["--secret", want]


def test_the_password_is_roots_alone_in_the_postgresql_container() -> None:
    # Its entrypoint reads it as root before it runs PostgreSQL as the user postgres.
    assert _podman_run_secret("postgres") == ["--secret", "qoss_pg_password,uid=0,gid=0,mode=0400,target=pg_password"]
    entry = (REPO_ROOT / "deploy/postgres/postgres-entrypoint").read_text()
    assert entry.index('cat "${POSTGRES_PASSWORD_FILE') < entry.index("runuser -u postgres")


def test_the_check_proves_the_api_runs_unprivileged_with_its_password() -> None:
    (secret,) = re.findall(r"^secret=(\S+)", CHECK, re.MULTILINE)
    assert secret in COMPOSE["secrets"]
    assert '((qoss_uid != 0)) || fail "the API container runs as root"' in CHECK
    assert 'api) want="$qoss_uid:$qoss_gid:400"' in CHECK
    assert "secrets/pg_password.txt" not in CHECK  # nothing written into the checkout


def test_the_api_build_context_holds_only_what_the_image_copies() -> None:
    ignore = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "everything is excluded first"
    copied = [src for line in (REPO_ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
              for src in line.split()[1:-1]]
    kept = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    assert {c.rstrip("/") for c in copied} == kept
    assert not any(k.startswith(("secrets", ".venv", "var")) for k in kept)


def test_the_api_image_installs_only_from_the_lock() -> None:
    text = _joined((REPO_ROOT / "Dockerfile").read_text())
    assert "--require-hashes -r requirements/runtime.txt" in text
    assert "--no-deps --no-build-isolation ." in text


def test_the_api_waits_for_postgresql_itself_with_a_bound() -> None:
    entry = (REPO_ROOT / "deploy/api/qoss-container").read_text()
    assert "psycopg.connect(" in entry
    assert 'os.environ.get("QOSS_DB_WAIT", "90")' in entry
    assert entry.index("psycopg.connect(") < entry.index("qoss db upgrade") < entry.index("exec qoss serve")
    assert all("healthcheck" not in s and "condition" not in str(s.get("depends_on")) for s in SERVICES.values())


def test_the_gateway_image_has_the_vici_plugin_and_kernel_libipsec() -> None:
    text = (REPO_ROOT / "deploy/strongswan/Dockerfile").read_text()
    assert "strongswan-swanctl" in text  # the VICI plugin: without it there is no charon.vici
    assert "libcharon-extra-plugins" in text  # kernel-libipsec
    conf = (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()
    assert re.search(r"kernel-libipsec \{\s*load = yes", conf)
    assert "ENV STRONGSWAN_CONF=/etc/qoss/strongswan.conf" in text
    assert "COPY strongswan.conf /etc/qoss/strongswan.conf" in text


def test_dockerfiles_copy_only_what_exists() -> None:
    for dockerfile in DOCKERFILES:
        context = REPO_ROOT if dockerfile.parent == REPO_ROOT else dockerfile.parent
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile}: {src}"


def test_scripts_and_entrypoints_are_executable() -> None:
    scripts = [REPO_ROOT / "deploy/api/qoss-container", REPO_ROOT / "deploy/base/build-base.sh",
               *Path(REPO_ROOT / "deploy").glob("*/*-entrypoint")]
    assert len(scripts) == 4
    for script in scripts:
        assert script.stat().st_mode & 0o111, script


def test_the_check_cleans_up_and_bounds_its_waits() -> None:
    assert "trap finish EXIT" in CHECK
    assert re.search(r"down\(\) \{\n.*down -v", CHECK)
    for wait in re.findall(r"for _ in \$\(seq 1 (\d+)\)", CHECK):
        assert int(wait) <= 120
    for line in CHECK.splitlines():
        if re.search(r"\bpodman (exec|build|logs)\b", line) and "podman build --help" not in line:
            assert "timeout " in line, line


def _unit(path: Path) -> dict[str, list[str]]:
    """A systemd unit's settings, each key's values in order (a key may be given more than once)."""
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _vici_gid(dockerfile: str) -> str:
    found = re.search(r"groupadd --system --gid (\d+) qoss-vici", _joined((REPO_ROOT / dockerfile).read_text()))
    assert found, dockerfile
    return found.group(1)


def test_the_api_image_runs_as_the_unprivileged_user_qoss_owning_its_data() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users == ["qoss"], "the image's last USER is qoss, not root"
    joined = _joined(text)
    assert re.search(r"useradd --system --uid (\d+) --gid qoss --groups qoss-vici .*--shell /usr/sbin/nologin qoss",
                     joined)
    assert "install -d -o qoss -g qoss -m 0700 /var/lib/qoss" in joined
    assert "WORKDIR /var/lib/qoss" in text
    assert re.search(r"^ENV .*QOSS_STATE_DIR=/var/lib/qoss/state", text, re.MULTILINE)
    assert text.index("USER qoss") > text.rindex("RUN ")  # nothing runs as root after it


def test_the_gateways_vici_socket_has_the_group_the_api_user_is_in() -> None:
    conf = (REPO_ROOT / "deploy/strongswan/strongswan.conf").read_text()
    assert re.search(r"^charon \{\n(?:\s*#.*\n)*\s*group = qoss-vici$", conf, re.MULTILINE)
    assert _vici_gid("deploy/strongswan/Dockerfile") == _vici_gid("Dockerfile")  # one gid across the volume


def test_the_debian_unit_runs_qoss_unprivileged_in_its_state_directory() -> None:
    unit = _unit(REPO_ROOT / "deploy/debian/qoss.service")
    single = {key: values[-1] for key, values in unit.items()}
    assert (single["User"], single["Group"], single["SupplementaryGroups"]) == ("qoss", "qoss", "qoss-vici")
    assert (single["StateDirectory"], single["StateDirectoryMode"], single["WorkingDirectory"]) == (
        "qoss", "0700", "/var/lib/qoss")
    environment = dict(value.split("=", 1) for value in unit["Environment"])
    assert environment["QOSS_STATE_DIR"].startswith("/var/lib/qoss/")
    assert environment["QOSS_DATABASE_URL"] == "sqlite:////var/lib/qoss/qoss.db"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes",
                       "CapabilityBoundingSet": "", "AmbientCapabilities": "", "RestrictSUIDSGID": "yes"}.items():
        assert single[key] == value, key
    assert single["ExecStart"].startswith("/opt/qoss/bin/qoss serve")


def test_the_debian_users_and_charons_socket_group_agree() -> None:
    lines = [line.split() for line in (REPO_ROOT / "deploy/debian/qoss.sysusers").read_text().splitlines()
             if line and not line.startswith("#")]
    assert ["g", "qoss-vici", "-"] in lines
    assert ["m", "qoss", "qoss-vici"] in lines
    (user,) = [line for line in lines if line[:2] == ["u", "qoss"]]
    assert user[-2:] == ["/var/lib/qoss", "/usr/sbin/nologin"]
    conf = (REPO_ROOT / "deploy/debian/strongswan-qoss-vici.conf").read_text()
    assert re.search(r"^charon \{\n\s*group = qoss-vici\n\}$", conf, re.MULTILINE)


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed")
def test_systemd_sysusers_makes_qoss_in_the_vici_group(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (tmp_path / "etc" / name).write_text("")
    sysusers = tmp_path / "usr/lib/sysusers.d"
    sysusers.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "deploy/debian/qoss.sysusers", sysusers / "qoss.conf")
    for _ in range(2):  # idempotent
        subprocess.run(["systemd-sysusers", f"--root={tmp_path}", "qoss.conf"], check=True, capture_output=True,
                       timeout=30)
    passwd = [line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()]
    groups = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines()}
    (qoss,) = [entry for entry in passwd if entry[0] == "qoss"]
    assert qoss[2] != "0" and qoss[3] == groups["qoss"][2]  # noqa: PT018
    assert qoss[5:] == ["/var/lib/qoss", "/usr/sbin/nologin"]
    assert groups["qoss-vici"][3] == "qoss"
