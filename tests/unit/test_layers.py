"""The layers, read from the imports of every module: the pure cores import only the
standard library and each other, and no arrow runs back up (domain ← services, adapters ←
bootstrap, web, measure ← api, ui, lab ← the app factory ← the command line)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

APP = REPO_ROOT / "app"


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Absolute module names imported anywhere in the file, functions included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            pytest.fail(f"{path}: relative import; the package uses absolute imports")
    return names


def _files(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (APP / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", _files("domain", "measure/domain"), ids=lambda p: _module(p))
def test_pure_cores_import_only_the_standard_library_and_the_domain(path: Path) -> None:
    foreign = {name for name in _imports(path)
               if name.partition(".")[0] not in sys.stdlib_module_names
               and not name.startswith(("app.domain", "app.measure.domain"))
               and name != "__future__"}
    assert not foreign, f"{_module(path)} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", _files("domain", "measure/domain", "adapters", "services", "measure/adapters",
                                        "measure/services"), ids=lambda p: _module(p))
def test_no_layer_imports_the_api_or_the_command_line(path: Path) -> None:
    upward = {name for name in _imports(path) if name.startswith(("app.api", "app.cli.main"))}
    assert not upward, f"{_module(path)} imports {sorted(upward)}"


@pytest.mark.parametrize("path", _files("domain", "measure/domain"), ids=lambda p: _module(p))
def test_the_domain_imports_no_service_or_adapter(path: Path) -> None:
    outward = {name for name in _imports(path)
               if name.startswith(("app.services", "app.adapters", "app.measure.adapters", "app.measure.services"))}
    assert not outward, f"{_module(path)} imports {sorted(outward)}"


@pytest.mark.parametrize("path", _files("services"), ids=lambda p: _module(p))
def test_services_import_no_database_library_and_no_concrete_adapter(path: Path) -> None:
    concrete = {name for name in _imports(path) if name.startswith(("sqlalchemy", "app.adapters", "vici"))}
    assert not concrete, (f"{_module(path)} imports {sorted(concrete)}: use a port of app.domain.ports "
                          "(the tunnel agent's roles: app.domain.agent.ports)")


#: The modules of the services that still import pydantic, each with why; nothing else may.
_PYDANTIC_STILL = {
    "app.services.agent.config": "the tunnel agent's YAML configuration reader: a file, not a request",
}


@pytest.mark.parametrize("path", _files("domain", "services"), ids=lambda p: _module(p))
def test_services_and_the_domain_import_no_pydantic(path: Path) -> None:
    """Services take and return domain values (``app.domain.requests``); the request documents,
    and pydantic with them, live at the edges (``app.web.schemas``)."""
    edge = {name for name in _imports(path)
            if name.partition(".")[0] in ("pydantic", "pydantic_core") or name.startswith("app.web")}
    if _module(path) in _PYDANTIC_STILL:
        assert not {name for name in edge if name.startswith("app.web")}, f"{_module(path)} imports the web edge"
        return
    assert not edge, f"{_module(path)} imports {sorted(edge)}: take a domain value, convert at the edge"


def test_every_exception_to_the_pydantic_rule_still_needs_it() -> None:
    """An entry of ``_PYDANTIC_STILL`` goes once its module no longer imports pydantic."""
    for module in _PYDANTIC_STILL:
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        assert "pydantic" in {name.partition(".")[0] for name in _imports(path)}, f"{module}: drop its exception"


def test_the_layers_test_sees_a_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import json\nfrom sqlalchemy import select\n\ndef f():\n    from app.api import main\n")
    assert _imports(bad) == {"json", "sqlalchemy", "app.api"}


@pytest.mark.parametrize("path", _files("ui"), ids=lambda p: _module(p))
def test_the_console_reaches_the_database_only_through_the_services(path: Path) -> None:
    """The console is a view over the services, through the API's request unit of work
    (``app.web.deps``): no database library, no repository, no charon of its own."""
    reached = {name for name in _imports(path)
               if name.startswith(("sqlalchemy", "app.adapters.db", "app.adapters.vici", "vici"))}
    assert not reached, f"{_module(path)} imports {sorted(reached)}"


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "migrations").rglob("*.py")), ids=lambda p: p.name)
def test_migrations_import_nothing_of_the_application(path: Path) -> None:
    """A revision is a fixed step: it must not change when the application's code does (the
    models' metadata is read only for ``alembic revision --autogenerate``, inside a branch)."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    top = {name for node in tree.body for name in (
        [a.name for a in node.names] if isinstance(node, ast.Import)
        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}
    assert not {name for name in top if name.startswith("app")}, f"{path.name} imports the application"
    if path.name != "env.py":
        assert not {name for name in _imports(path) if name.startswith("app")}, f"{path.name} imports the application"
