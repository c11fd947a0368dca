"""The suite-wide secret sweep finds what it is meant to find (so a clean sweep means something)."""

from __future__ import annotations

import base64
import io
import os
import secrets
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.repositories import AuditRepository
from tests import REPO_ROOT
from tests.fixtures.secrets import dump_postgres, expand, find_leaks

ON_POSTGRES = pytest.mark.parametrize("db_backend", [pytest.param("postgresql", marks=pytest.mark.postgres)],
                                      indirect=True)


def test_sweep_finds_raw_hex_and_base64_forms(tmp_path: Path) -> None:
    secret = secrets.token_bytes(32)
    files = []
    for i, form in enumerate((secret, secret.hex().encode(), base64.b64encode(secret))):
        path = tmp_path / f"f{i}.log"
        path.write_bytes(b"noise " + form + b" noise")
        files.append(path)
    clean = tmp_path / "clean.db"
    clean.write_bytes(secrets.token_bytes(4096))
    leaks = find_leaks([secret], [*files, clean])
    assert sorted(leak.split(":")[0] for leak in leaks) == sorted(str(f) for f in files)


def plant(database_url: str, secret: str) -> None:
    """A secret in an audit record's detail, as a leaking product would write it."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            AuditRepository(session).append(request_id="planted", token_id=None, token_name=None, scopes=[],
                                            source="test", action="POST", object="/v1/x", outcome=201,
                                            detail=f"oops {secret}")
    finally:
        engine.dispose()


@ON_POSTGRES
def test_postgres_dump_holds_text_json_and_bytea_rows(database_url: str, tmp_path: Path) -> None:
    text_secret, json_secret, bytea_secret = (secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                                              secrets.token_bytes(32))
    never_written = secrets.token_urlsafe(32)
    plant(database_url, text_secret)
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:  # a JSON and a bytea column of a table outside the product's schema
            conn.execute(text("CREATE TABLE extra (doc jsonb, blob bytea)"))
            conn.execute(text("INSERT INTO extra VALUES (CAST(:doc AS jsonb), :blob)"),
                         {"doc": f'{{"k": "{json_secret}"}}', "blob": bytea_secret})
    finally:
        engine.dispose()
    out = io.BytesIO()
    tables = dump_postgres(database_url, out)
    dump = tmp_path / "db.pgdump"
    dump.write_bytes(out.getvalue())
    assert tables >= 10
    assert b"-- public.audit_log" in out.getvalue() or b"-- public.audit" in out.getvalue()
    for secret in (text_secret, json_secret, bytea_secret):
        assert find_leaks([secret.encode() if isinstance(secret, str) else secret], [dump]), secret
    assert find_leaks([never_written.encode()], [dump]) == []


INNER_TEST = '''
import pytest

from tests.fixtures.secrets import register
from tests.unit.test_secret_sweep import plant

SECRET = "{secret}"


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_writes_a_row(database_url):
    register(SECRET)
    if {planted}:
        plant(database_url, SECRET)
'''


@pytest.mark.postgres
@pytest.mark.parametrize(("planted", "workers"), [(True, ()), (False, ()), (True, ("-n", "2"))],
                         ids=["planted", "clean", "planted-two-workers"])
def test_a_secret_in_a_postgres_row_fails_the_run(pytester: pytest.Pytester, planted: bool,
                                                  workers: tuple[str, ...]) -> None:
    """A whole pytest run whose only test leaves a registered secret in a PostgreSQL row fails,
    also when a pytest-xdist worker ran the test (the controller sweeps the workers' files)."""
    assert os.environ.get("QOSS_TEST_PG_URL"), "the PostgreSQL cases need QOSS_TEST_PG_URL (scripts/test.sh)"
    pytester.makeconftest((REPO_ROOT / "tests" / "conftest.py").read_text().replace('"pytester", ', ""))
    pytester.makepyfile(test_inner=INNER_TEST.format(secret=secrets.token_urlsafe(32), planted=planted))
    pytester.makeini("[pytest]\nmarkers =\n    postgres: PostgreSQL\n")
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env_path) if p)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", *workers)
    finally:
        if env_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env_path
    result.assert_outcomes(passed=1)  # the test itself passes: only the sweep can fail the run
    if planted:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*secret sweep: 1 secrets,*(1 PostgreSQL dumps), 1 leaks*",
                                     "*LEAK *.pgdump:*"])
    else:
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["*secret sweep: 1 secrets,*(1 PostgreSQL dumps), 0 leaks*"])


def test_a_registered_token_is_searched_for_with_and_without_its_prefix(tmp_path: Path) -> None:
    secret = secrets.token_urlsafe(32)
    token = f"qoss_{secrets.token_hex(6)}_{secret}"
    added = expand(token)
    leaked = tmp_path / "app.log"
    leaked.write_text(f"header {secret}\n")
    assert find_leaks(added, [leaked])


def test_a_form_inside_a_longer_token_and_a_secret_with_spaces_are_both_found(tmp_path: Path) -> None:
    token, phrase = b"qoss_0123456789abcdef0123456789abcdef", b"a pre-shared key: with spaces, 32+ chars"
    glued = tmp_path / "glued.log"
    glued.write_bytes(b"Authorization=Bearer" + token + b"trailing0123 and " + phrase + b"\n")
    hexed = tmp_path / "hexed.db"
    hexed.write_bytes(b"\x00\x01" + b"ff" + phrase.hex().encode() + b"00\x02")
    clean = tmp_path / "clean.log"
    clean.write_bytes(b"Bearer qoss_0123456789abcdef0123456789abcdeX " + phrase[:-1] + b"\n")
    leaks = find_leaks([token, phrase], [glued, hexed, clean])
    assert len([leak for leak in leaks if leak.startswith(str(glued))]) == 2
    assert len([leak for leak in leaks if leak.startswith(str(hexed))]) == 1
    assert not [leak for leak in leaks if leak.startswith(str(clean))]


@pytest.mark.parametrize("length", [16, 17, 31, 32, 33, 64])
def test_a_form_is_found_at_every_offset_and_at_the_very_end_but_not_cut_off(tmp_path: Path, length: int) -> None:
    secret = bytes(range(100, 100 + length))  # no 8-byte piece of it repeats, none is in the filler
    files = []
    for offset in range(0, 60):
        path = tmp_path / f"at-{offset}"
        path.write_bytes(b"." * offset + secret + b"." * (offset % 3))
        files.append(path)
    cut = tmp_path / "cut"
    cut.write_bytes(b"." * 40 + secret[:-1])
    leaks = find_leaks([secret], [*files, cut])
    assert sorted(leak.split(":")[0] for leak in leaks) == sorted(str(p) for p in files)
