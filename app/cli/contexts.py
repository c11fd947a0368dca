"""``qoss context``: named services in the configuration file (:mod:`app.cli.client`), as
``kubectl config`` keeps clusters: ``set`` one, ``use`` one, ``list`` them, ``remove`` one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.client import Output, config_path, load_config, save_config, show

__all__ = ["context_app"]

context_app = typer.Typer(help="Named qoss services for the commands that go through the API "
                               "(QOSS_URL and QOSS_TOKEN override them).", no_args_is_help=True)

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _check_name(name: str) -> str:
    import re

    if not re.match(_NAME, name):
        raise typer.BadParameter("1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                                 param_hint="NAME")
    return name


@context_app.command("set")
def context_set(
    name: Annotated[str, typer.Argument(help="the context's name")],
    url: Annotated[str, typer.Option(help="the service, e.g. https://qoss.example.net")],
    token_file: Annotated[Path | None, typer.Option(
        help="a file holding the token (read at each command; kept by path)")] = None,
    token_stdin: Annotated[bool, typer.Option(
        "--token-stdin", help="read the token from standard input and keep it in the file (mode 0600)")] = False,
    ca_file: Annotated[Path | None, typer.Option(help="the CA that signed the service's certificate")] = None,
    use: Annotated[bool, typer.Option("--use", help="make it the current context")] = False,
) -> None:
    """Add or replace a context. A token is never taken on the command line."""
    import sys

    _check_name(name)
    if not url.startswith(("http://", "https://")):
        raise typer.BadParameter("starts with http:// or https://", param_hint="--url")
    if token_file is not None and token_stdin:
        raise typer.BadParameter("give --token-file or --token-stdin, not both")
    for path, hint in ((token_file, "--token-file"), (ca_file, "--ca-file")):
        if path is not None and not path.is_file():
            raise typer.BadParameter(f"{path}: no such file", param_hint=hint)
    entry: dict[str, Any] = {"url": url.rstrip("/")}
    if token_file is not None:
        entry["token-file"] = str(token_file.resolve())
    if token_stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise typer.BadParameter("standard input held no token", param_hint="--token-stdin")
        entry["token"] = token
    if ca_file is not None:
        entry["ca-file"] = str(ca_file.resolve())
    data = load_config(creating=True)
    data["contexts"][name] = entry
    if use or not data.get("current-context"):
        data["current-context"] = name
    path = save_config(data)
    typer.echo(f"context {name} set in {path}" + (" (current)" if data["current-context"] == name else ""))


@context_app.command("use")
def context_use(name: str) -> None:
    """Make NAME the current context."""
    data = load_config()
    if name not in data["contexts"]:
        raise typer.BadParameter(f"no context {name!r} in {config_path()}", param_hint="NAME")
    data["current-context"] = name
    save_config(data)
    typer.echo(f"current context: {name}")


@context_app.command("list")
def context_list(output: Output = None) -> None:
    """The contexts (their tokens never shown: only where each comes from)."""
    data = load_config()
    rows = [{"name": name, "current": name == data.get("current-context"), "url": entry.get("url"),
             "token": "file " + str(entry["token-file"]) if entry.get("token-file") else
             ("kept in the configuration file" if entry.get("token") else "none")}
            for name, entry in sorted(data["contexts"].items())]
    show(rows, output, ["name", "current", "url", "token"])


@context_app.command("remove")
def context_remove(name: str) -> None:
    """Forget a context (and its token, if the file kept it)."""
    data = load_config()
    if data["contexts"].pop(name, None) is None:
        raise typer.BadParameter(f"no context {name!r} in {config_path()}", param_hint="NAME")
    if data.get("current-context") == name:
        data.pop("current-context")
    save_config(data)
    typer.echo(f"context {name} removed")
