"""The wheel, installed as a user installs it: not editable, into a fresh virtualenv with
only the locked runtime packages, then used from an empty directory far from the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import REPO_ROOT
from tests.fixtures.served import serving

UV = ["bash", str(REPO_ROOT / "scripts" / "uv.sh")]


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    out = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, f"{args}: {out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run(*UV, "build", "--quiet", "--wheel", "--no-build-isolation", "--python", sys.executable,
         "-o", str(dist), str(REPO_ROOT), cwd=REPO_ROOT)
    (built,) = dist.glob("qoss-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the runtime lock and the wheel, nothing else (no dev tools, no checkout)."""
    env = tmp_path_factory.mktemp("venv") / "v"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    _run(*UV, "venv", "--quiet", "--python", str(base), str(env), cwd=REPO_ROOT)
    _run(*UV, "pip", "sync", "--quiet", "--python", str(env / "bin/python"), "--require-hashes",
         str(REPO_ROOT / "requirements/runtime.txt"), cwd=REPO_ROOT)
    _run(*UV, "pip", "install", "--quiet", "--python", str(env / "bin/python"), "--no-deps", str(wheel),
         cwd=REPO_ROOT)
    return env


def test_the_wheel_carries_migrations_and_shipped_data_and_no_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "app/_shipped/ratings/esaf-2006.yaml" in names
    assert "app/_shipped/ratings/standards-2026.yaml" in names
    assert "app/_shipped/policies/voip.yaml" in names
    assert "app/_shipped/migrations/env.py" in names
    assert {"app/ui/templates/base.html", "app/ui/static/htmx.min.js", "app/ui/static/htmx.LICENSE"} <= set(names)
    assert {f"app/api/docs/static/{f}" for f in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js",
                                                 "swagger-ui.LICENSE", "redoc.LICENSE")} <= set(names)
    assert any(n.startswith("app/_shipped/migrations/versions/") and n.endswith(".py") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]


def test_the_runtime_install_has_no_dev_tools(venv: Path) -> None:
    listed = _run(*UV, "pip", "list", "--python", str(venv / "bin/python"), "--format", "json", cwd=REPO_ROOT)
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert {"qoss", "fastapi", "sqlalchemy", "alembic", "vici"} <= installed
    assert not installed & {"pytest", "mypy", "ruff", "schemathesis", "hypothesis"}
    assert not installed & {"matplotlib", "numpy", "pillow"}, "plotting belongs to the bench extra"


def test_without_the_bench_extra_bench_report_names_the_extra(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text("{}")  # a file that is there: the refusal is the missing extra
    out = subprocess.run([str(venv / "bin/qoss"), "bench", "report", "--micro", str(tmp_path / "m.json"),
                          "--out", str(tmp_path / "r")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2
    assert "qoss[bench]" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
def served(venv: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`qoss db upgrade` then `qoss serve` from an empty directory outside the checkout."""
    work = tmp_path / "empty"
    work.mkdir()
    env = {"QOSS_DATABASE_URL": "sqlite:///./qoss.db", "PYTHONPATH": "", "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    upgraded = _run(str(venv / "bin/qoss"), "db", "upgrade", cwd=work, env=env)
    assert "esaf-2006" in upgraded
    with serving([str(venv / "bin/qoss"), "serve"], env={**os.environ, **env}, log=tmp_path / "serve.log",
                 cwd=work) as (base, _):
        yield base, work


def test_the_installed_wheel_migrates_serves_and_negotiates_from_an_empty_directory(
        served: tuple[str, Path]) -> None:
    base, work = served
    body = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"confidentiality": 8,
                                                                                   "integrity": 4}}]}
    r = httpx.post(f"{base}/v1/negotiations", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["suite"]["encryption"] == "aes128"
    assert r.json()["suite"]["integrity"] == "sha1"
    tables = httpx.get(f"{base}/v1/rating-tables", timeout=10).json()
    assert {"esaf-2006", "standards-2026"} <= {t["name"] for t in tables}
    console = httpx.get(f"{base}/ui/login", timeout=10)  # the console's templates and static files travel too
    assert console.status_code == 200 and 'name="token"' in console.text  # noqa: PT018
    assert httpx.get(f"{base}/ui/static/htmx.min.js", timeout=10).status_code == 200
    for asset in ("swagger-ui-bundle.js", "redoc.standalone.js"):  # /docs and /redoc from the installed package
        assert httpx.get(f"{base}/docs/static/{asset}", timeout=10).status_code == 200, asset
    assert (work / "qoss.db").is_file()
    assert not (work / "app").exists()
