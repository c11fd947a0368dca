"""``qoss ratings`` and ``qoss policies``: rating tables and policies, through the service's API
(:mod:`app.cli.client`): every change is checked, audited under the token's name and moves the
running tunnels it concerns, as any client's change does."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.client import Output, connect, show
from app.cli.common import read_input
from app.domain.errors import QossError

__all__ = ["policies_app", "ratings_app"]

ratings_app = typer.Typer(help="Rating tables (through the service: QOSS_URL, QOSS_TOKEN or a context).",
                          no_args_is_help=True)
policies_app = typer.Typer(help="Policies (through the service: QOSS_URL, QOSS_TOKEN or a context).",
                           no_args_is_help=True)

RevertTo = Annotated[int, typer.Option("--to", min=1, help="the revision whose content to restore")]
RevertWhy = Annotated[str | None, typer.Option(help="why, for the history")]
_REVISION_COLUMNS = ["revision", "author", "created_at", "message", "changes"]


def _table_path(name: str) -> str:
    return f"/v1/rating-tables/{name}"


@ratings_app.command("list")
def ratings_list(output: Output = None) -> None:
    """List the rating tables with their current revision."""
    with connect() as service:
        show(service.call("GET", "/v1/rating-tables"), output)


@ratings_app.command("export")
def ratings_export(
    name: str,
    fmt: Annotated[str, typer.Option("--format", help="yaml or csv")] = "yaml",
) -> None:
    """Print a table as YAML or CSV (what `import` reads back)."""
    if fmt not in ("yaml", "csv"):
        raise typer.BadParameter("yaml or csv", param_hint="--format")
    with connect() as service:
        typer.echo(service.call("GET", f"{_table_path(name)}/export", params={"format": fmt}), nl=False)


@ratings_app.command("import")
def ratings_import(
    path: Annotated[str | None, typer.Argument(help="YAML or CSV file, or - for stdin")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="yaml or csv (default: from the file name)")] = None,
    name: Annotated[str | None, typer.Option(help="table name (required for CSV)")] = None,
    revision: Annotated[int | None, typer.Option(help="replace this current revision of an existing table")] = None,
    shipped: Annotated[str | None, typer.Option(
        "--shipped", help="restore this shipped table (loaded once per database: deleted, it stays deleted)")] = None,
    output: Output = None,
) -> None:
    """Import a table (new, or a new revision with --revision), or restore a shipped one with --shipped."""
    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    kind = fmt or ("csv" if path and path.endswith(".csv") else "yaml")
    if kind not in ("yaml", "csv"):
        raise typer.BadParameter("yaml or csv", param_hint="--format")
    text = read_input(path) if path is not None else ""  # before the service: a refusal sends nothing
    with connect() as service:
        if shipped is not None:
            table = service.call("POST", f"{_table_path(shipped)}/restore")
        else:
            params: dict[str, Any] = {"format": kind, **({"name": name} if name else {}),
                                      **({"revision": revision} if revision is not None else {})}
            table = service.call("POST", "/v1/rating-tables/import", params=params, content=text.encode(),
                                 headers={"Content-Type": "text/plain; charset=utf-8"})
    show({"name": table["name"], "revision": table["revision"], "ratings": len(table["ratings"])}, output)


@ratings_app.command("edit")
def ratings_edit(
    name: str,
    algorithm: str,
    confidentiality: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    integrity: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    key_exchange: Annotated[int | None, typer.Option("--key-exchange", min=0, max=10)] = None,
    performance: Annotated[float | None, typer.Option(min=0, max=10)] = None,
    reason: Annotated[str | None, typer.Option(help="why, kept with the rating")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="change nothing: print the impact on running tunnels "
                                                            "and agent sessions")] = False,
    output: Output = None,
) -> None:
    """Edit one algorithm's rating (a new revision), as PATCH /v1/rating-tables/NAME/ratings/ALG does.

    With --dry-run nothing is kept: prints which running tunnels and agent sessions would fall
    below their minimums, get a cheaper or different choice, or stay. Otherwise the service
    keeps the edit and moves the tunnels below their minimums to a compliant suite
    (make-before-break); the answer says what it found.
    """
    changes = {k: v for k, v in {"confidentiality": confidentiality, "integrity": integrity,
                                 "key_exchange": key_exchange, "performance": performance,
                                 "reason": reason}.items() if v is not None}
    if not changes:
        raise typer.BadParameter("give at least one of --confidentiality --integrity --key-exchange --performance "
                                 "--reason")
    with connect() as service:
        base = service.revision(_table_path(name))
        answer = service.call("PATCH", f"{_table_path(name)}/ratings/{algorithm}", json=changes,
                              headers={"If-Match": f'"{base}"'}, params={"dry_run": "true"} if dry_run else None)
    if dry_run:  # what it would make, and its impact
        out = {"table": name, "revision": answer["would_be"]["revision"], "dry_run": True,
               "impact": answer["impact"], "sessions": answer["sessions"]}
    else:  # kept: the service moves the tunnels it concerns (GET /v1/tunnels shows them)
        out = {"table": name, "revision": answer["revision"]}
    show(out, output)


@ratings_app.command("history")
def ratings_history(name: str, output: Output = None) -> None:
    """A table's revisions, oldest first: who, when, why, what changed."""
    with connect() as service:
        show(service.call("GET", f"{_table_path(name)}/revisions"), output, _REVISION_COLUMNS)


def _revert(path: str, kind: str, name: str, to: int, message: str | None, output: Any) -> None:
    with connect() as service:
        base = service.revision(path)
        answer = service.call("POST", f"{path}/revert", json={"revision": to, **({"message": message} if message
                                                                                 else {})},
                              headers={"If-Match": f'"{base}"'})
    show({kind: name, "revision": answer["revision"], "reverted_to": to}, output)


@ratings_app.command("revert")
def ratings_revert(name: str, to: RevertTo, message: RevertWhy = None, output: Output = None) -> None:
    """Go back to revision --to: a new revision with its content ("reverted to N"), history kept."""
    _revert(_table_path(name), "table", name, to, message, output)


@policies_app.command("list")
def policies_list(output: Output = None) -> None:
    """List the stored policies."""
    with connect() as service:
        show(service.call("GET", "/v1/policies"), output)


@policies_app.command("export")
def policies_export(name: str) -> None:
    """Print a policy as YAML (what `import` and `check` read)."""
    import yaml

    with connect() as service:
        policy = service.call("GET", f"/v1/policies/{name}")["policy"]
    typer.echo(yaml.safe_dump(policy, sort_keys=False), nl=False)


@policies_app.command("history")
def policies_history(name: str, output: Output = None) -> None:
    """A policy's revisions, oldest first: who, when, why, what changed."""
    with connect() as service:
        show(service.call("GET", f"/v1/policies/{name}/revisions"), output, _REVISION_COLUMNS)


@policies_app.command("revert")
def policies_revert(name: str, to: RevertTo, message: RevertWhy = None, output: Output = None) -> None:
    """Go back to revision --to of a policy: a new revision with its content."""
    _revert(f"/v1/policies/{name}", "policy", name, to, message, output)


@policies_app.command("import")
def policies_import(
    path: Annotated[str | None, typer.Argument(help="policy YAML file, or - for stdin")] = None,
    shipped: Annotated[str | None, typer.Option(
        "--shipped", help="restore this shipped policy (loaded once per database: deleted, it stays deleted)")] = None,
    output: Output = None,
) -> None:
    """Store a new policy from a YAML file, or restore a shipped one with --shipped."""
    from app.adapters import files
    from app.cli.refusals import fail

    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    document: dict[str, Any] = {}
    if path is not None:  # read and checked before the service: a refusal sends nothing
        try:
            document = files.parse_policy_yaml(read_input(path)).as_dict()
        except QossError as exc:
            fail(exc)
    with connect() as service:
        if shipped is not None:
            answer = service.call("POST", f"/v1/policies/{shipped}/restore")
        else:
            answer = service.call("POST", "/v1/policies", json=document)
    show({"name": answer["name"], "revision": answer["revision"]}, output)


@policies_app.command("check")
def policies_check(paths: Annotated[list[Path], typer.Argument(help="policy YAML files")]) -> None:
    """Validate policy files on this machine (no service needed); exit 1 if any is invalid."""
    from app.adapters.files import load_policy

    bad = 0
    for path in paths:
        try:
            policy = load_policy(path)
        except FileNotFoundError:
            bad += 1
            typer.echo(f"{path}: INVALID: no such file")
            continue
        except (QossError, OSError) as exc:
            bad += 1
            typer.echo(f"{path}: INVALID: {exc}")
            continue
        typer.echo(f"{path}: ok ({policy.name}, {policy.option.value}, min {policy.min_levels.as_dict()})")
    if bad:
        raise typer.Exit(1)
