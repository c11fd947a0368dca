"""``qoss ratings`` and ``qoss policies``: rating tables and policies, through the service's API
(:mod:`app.cli.client`): every change is checked, audited under the token's name and moves the
running tunnels it concerns, as any client's change does."""

from __future__ import annotations

import json
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
    post_quantum: Annotated[int | None, typer.Option("--post-quantum", min=0, max=10,
                                                     help="a post-quantum mechanism's level")] = None,
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
                                 "key_exchange": key_exchange, "post_quantum": post_quantum,
                                 "performance": performance,
                                 "reason": reason}.items() if v is not None}
    if not changes:
        raise typer.BadParameter("give at least one of --confidentiality --integrity --key-exchange --post-quantum "
                                 "--performance --reason")
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
    revision: Annotated[int | None, typer.Option(
        min=1, help="replace this revision of an existing policy (as `replace --revision`)")] = None,
    shipped: Annotated[str | None, typer.Option(
        "--shipped", help="restore this shipped policy (loaded once per database: deleted, it stays deleted)")] = None,
    output: Output = None,
) -> None:
    """Store a new policy from a YAML file (with --revision, a new revision of an existing one), or
    restore a shipped one with --shipped."""
    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    if revision is not None and path is not None:
        policies_replace(path, revision=revision, dry_run=False, output=output)
        return
    document = _policy_file(path) if path is not None else {}  # checked before the service: a refusal sends nothing
    with connect() as service:
        if shipped is not None:
            answer = service.call("POST", f"{_policy_path(shipped)}/restore")
        else:
            made = service.send("POST", "/v1/policies", json=document)
            if made.status_code != 201:
                service.refused(made, {"AlreadyExists": "to change it: qoss policies replace FILE, or import FILE "
                                                        "--revision N, or qoss policies edit NAME"})
            answer = made.json()
    show({"name": answer["name"], "revision": answer["revision"]}, output)


PolicyDryRun = Annotated[bool, typer.Option("--dry-run", help="change nothing: print the impact on running tunnels "
                                                              "and agent sessions")]
#: What ``policies edit --set`` may change (a policy's fields but its name; two of them by their parts).
_POLICY_FIELDS = ("description", "min_levels", "objectives", "objective_id", "allow", "deny", "traffic", "mode",
                  "pfs", "strict", "rating_table", "ike_lifetime", "child_lifetime")
_POLICY_PARTS = ("min_levels", "traffic")


def _policy_path(name: str) -> str:
    return f"/v1/policies/{name}"


def _policy_file(path: str) -> dict[str, Any]:
    """A policy file's document, read and checked here (a refusal exits 2 with nothing sent)."""
    from app.adapters import files
    from app.cli.refusals import fail

    try:
        return files.parse_policy_yaml(read_input(path)).as_dict()
    except QossError as exc:
        fail(exc)


def _settings(assignments: list[str]) -> dict[tuple[str, ...], Any]:
    """``--set FIELD=VALUE`` as {field path: value} (None: remove the field), each value read as
    YAML; a field a policy does not have is refused before anything is sent."""
    import yaml

    out: dict[tuple[str, ...], Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        where = tuple(key.strip().split("."))
        if not sep or where[0] not in _POLICY_FIELDS or len(where) > (2 if where[0] in _POLICY_PARTS else 1):
            raise typer.BadParameter(f"{item[:80]!r}: FIELD=VALUE, FIELD one of {', '.join(_POLICY_FIELDS)} "
                                     f"(or {', '.join(p + '.NAME' for p in _POLICY_PARTS)})", param_hint="--set")
        try:
            out[where] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise typer.BadParameter(f"{key}: the value is not YAML", param_hint="--set") from None
    return out


def _changed(document: dict[str, Any], changes: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """``document`` with ``changes`` made (a None value removes its field)."""
    out: dict[str, Any] = json.loads(json.dumps(document))
    for where, value in changes.items():
        holder = out
        if len(where) == 2:
            holder = out[where[0]] = dict(out.get(where[0]) or {})
        if value is None:
            holder.pop(where[-1], None)
        else:
            holder[where[-1]] = value
    return out


def _edited_in_editor(name: str, revision: int, text: str) -> str:
    """``text`` as the user left it in ``$VISUAL`` / ``$EDITOR`` (``vi``), from a private file
    removed afterwards; an editor that cannot start or fails is refused, nothing sent."""
    import os
    import shlex
    import subprocess
    import tempfile

    from app.cli.client import refuse

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="qoss-edit-") as where:
        path = Path(where) / f"{name}.yaml"
        path.write_text(f"# policy {name}, revision {revision}: save and quit to send it; an unchanged file "
                        f"sends nothing\n{text}", encoding="utf-8")
        try:
            done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except (OSError, ValueError) as exc:
            refuse(f"cannot start the editor {editor!r} (VISUAL or EDITOR): {type(exc).__name__}; nothing sent")
        if done.returncode != 0:
            refuse(f"the editor {editor!r} exited with status {done.returncode}; nothing sent")
        return read_input(str(path))


def _put_policy(service: Any, name: str, document: dict[str, Any], base: int, dry_run: bool,
                output: Any) -> None:
    """PUT a policy's document as edited on revision ``base`` (If-Match) and print the outcome."""
    answer = service.call("PUT", _policy_path(name), json=document, headers={"If-Match": f'"{base}"'},
                          params={"dry_run": "true"} if dry_run else None)
    if dry_run:
        show({"policy": name, "revision": answer["would_be"]["revision"], "dry_run": True,
              "impact": answer["impact"], "sessions": answer["sessions"]}, output)
    else:
        show({"policy": name, "revision": answer["revision"]}, output)


@policies_app.command("edit")
def policies_edit(
    name: str,
    confidentiality: Annotated[int | None, typer.Option(min=0, max=10, help="minimum confidentiality level")] = None,
    integrity: Annotated[int | None, typer.Option(min=0, max=10, help="minimum integrity level")] = None,
    key_exchange: Annotated[int | None, typer.Option("--key-exchange", min=0, max=10,
                                                     help="minimum key exchange level")] = None,
    post_quantum: Annotated[int | None, typer.Option("--post-quantum", min=0, max=10,
                                                     help="minimum post-quantum level (0: none)")] = None,
    assignments: Annotated[list[str] | None, typer.Option(
        "--set", metavar="FIELD=VALUE", help="set a field to a YAML value (repeat for more), e.g. mode=transport, "
        "traffic.packet_size=200, pfs=false, a list in YAML's flow form; FIELD= removes it")] = None,
    dry_run: PolicyDryRun = False,
    output: Output = None,
) -> None:
    """Edit a policy: a new revision, as PUT /v1/policies/NAME with If-Match does.

    With options, the fields they name change; with none, the policy opens as YAML in $VISUAL or
    $EDITOR (vi) and what is saved is sent. The edit names the revision it was made on: if
    someone saved since, it lands over theirs when it changes none of the fields they changed,
    else the service refuses it (EditConflict, naming each field with their value and yours) and
    nothing is written. With --dry-run nothing is kept: prints which running tunnels and agent
    sessions would fall below their minimums, get a cheaper or different choice, or stay.
    """
    import yaml

    from app.cli.refusals import fail
    from app.domain.errors import InvalidPolicy
    from app.domain.policies import Policy

    changes = _settings(assignments or [])
    for level, value in (("confidentiality", confidentiality), ("integrity", integrity),
                         ("key_exchange", key_exchange), ("post_quantum", post_quantum)):
        if value is not None:
            changes[("min_levels", level)] = value
    with connect() as service:
        answer = service.send("GET", _policy_path(name))
        if answer.status_code != 200:
            service.refused(answer)
        base, current = int(answer.headers["ETag"].strip('"')), answer.json()["policy"]
        if changes:
            document = _changed(current, changes)
        else:
            text = _edited_in_editor(name, base, yaml.safe_dump(current, sort_keys=False))
            try:
                edited = yaml.safe_load(text) if text.strip() else None
            except yaml.YAMLError:
                fail(InvalidPolicy("the edited policy is not YAML; nothing sent"))
            if not isinstance(edited, dict):
                fail(InvalidPolicy("the edited policy is not a YAML mapping; nothing sent"))
            document = edited
        if document.get("name", name) != name:
            fail(InvalidPolicy(f"the edited document names policy {str(document['name'])[:64]!r}, not {name!r}; "
                               "a policy keeps its name"))
        try:
            document = Policy.from_dict(document, name=name).as_dict()  # checked here: a refusal sends nothing
        except QossError as exc:
            fail(exc)
        if document == current and not dry_run:
            typer.echo(f"qoss: policy {name} unchanged; nothing sent", err=True)
            show({"policy": name, "revision": base}, output)
            return
        _put_policy(service, name, document, base, dry_run, output)


@policies_app.command("replace")
def policies_replace(
    path: Annotated[str, typer.Argument(help="policy YAML file (its name says which policy), or - for stdin")],
    revision: Annotated[int | None, typer.Option(
        min=1, help="the revision the file was made from (default: the current one): if others saved since, "
        "the file lands over theirs when it changes none of their fields, else EditConflict")] = None,
    dry_run: PolicyDryRun = False,
    output: Output = None,
) -> None:
    """Replace a stored policy with a YAML file: a new revision (PUT /v1/policies/NAME, If-Match)."""
    document = _policy_file(path)  # checked before the service: a refusal sends nothing
    name = str(document["name"])
    with connect() as service:
        base = revision if revision is not None else service.revision(_policy_path(name))
        _put_policy(service, name, document, base, dry_run, output)


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
