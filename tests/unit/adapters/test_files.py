"""app.adapters.files: YAML and CSV round trips, syntax errors, the size cap, directory loading."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.adapters import files, rating_csv, yaml_dialect
from app.adapters.files import (
    MAX_DOCUMENT_BYTES,
    dump_policy_yaml,
    dump_rating_table_csv,
    dump_rating_table_yaml,
    load_policies,
    load_policy,
    load_rating_table,
    load_rating_tables,
    parse_policy_yaml,
    parse_rating_table_csv,
    parse_rating_table_yaml,
)
from app.adapters.rating_csv import CSV_COLUMNS
from app.domain.errors import InvalidPolicy, InvalidRatingTable
from app.domain.policies import Policy
from app.domain.ratings import Measurement, Rating, RatingTable
from app.settings import SHIPPED_POLICIES_DIR, SHIPPED_RATINGS_DIR

RATINGS = SHIPPED_RATINGS_DIR
POLICIES = SHIPPED_POLICIES_DIR

SMALL_YAML = """\
name: lab-small
description: two rows
source: a test
ratings:
  - algorithm: aes128
    confidentiality: 8
    performance: 8
  - algorithm: sha1
    integrity: 5
    performance: 6.5
"""


def measured_table() -> RatingTable:
    return RatingTable.of(
        "lab-measured",
        [
            Rating(
                algorithm="aes128gcm16", confidentiality=8, integrity=8, performance=9.25, source="measurement",
                reason="iperf3 through kernel-libipsec", requirement="MUST",
                measurement=Measurement(throughput_mbps=463.0, a_ns_per_byte=1.25, b_ns=830.5, machine="lab-1",
                                        backend="kernel-libipsec", date="2026-01-05", samples=5, method="iperf3",
                                        spread=0.04),
            ),
            Rating(algorithm="sha256", integrity=8, performance=3.0,
                   measurement=Measurement(throughput_mbps=324.0)),
            Rating(algorithm="x25519", key_exchange=8, performance=8.19, reason="a, b; \"quoted\"\nsecond line"),
        ],
        description="multi\nline: description",
        source="qoss bench",
    )


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- YAML round trips


@pytest.mark.parametrize("path", sorted(RATINGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_table_yaml_round_trip_is_exact(path: Path) -> None:
    table = load_rating_table(path)
    assert parse_rating_table_yaml(dump_rating_table_yaml(table)) == table


def test_measured_table_yaml_round_trip_is_exact() -> None:
    table = measured_table()
    assert parse_rating_table_yaml(dump_rating_table_yaml(table)) == table


def test_yaml_dump_keeps_the_table_order_and_names_the_table() -> None:
    text = dump_rating_table_yaml(measured_table())
    doc = yaml.safe_load(text)
    assert doc["name"] == "lab-measured"
    assert [r["algorithm"] for r in doc["ratings"]] == ["aes128gcm16", "sha256", "x25519"]


def test_parse_yaml_name_argument_overrides_the_document() -> None:
    assert parse_rating_table_yaml(SMALL_YAML, name="renamed").name == "renamed"


def test_yaml_unquoted_measurement_date_is_read_as_text() -> None:
    text = SMALL_YAML.replace("    performance: 8\n", "    performance: 8\n    measurement: {date: 2026-01-05}\n")
    table = parse_rating_table_yaml(text)
    measurement = table.ratings["aes128"].measurement
    assert measurement is not None
    assert measurement.date == "2026-01-05"


_TEXT = st.text(max_size=60)


@settings(max_examples=400, deadline=None)
@given(reason=_TEXT, description=_TEXT, source=_TEXT, machine=_TEXT,
       performance=st.floats(min_value=0, max_value=10, allow_nan=False),
       throughput=st.none() | st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_any_text_and_numbers_round_trip_through_yaml_and_csv(
    reason: str, description: str, source: str, machine: str, performance: float, throughput: float | None
) -> None:
    measurement = Measurement(throughput_mbps=throughput, machine=machine or None)
    rating = Rating(algorithm="aes256", confidentiality=10, performance=performance, source=source, reason=reason,
                    requirement="MUST", measurement=measurement if measurement.as_dict() else None)
    table = RatingTable.of("prop", [rating], description=description, source=source)
    assert parse_rating_table_yaml(dump_rating_table_yaml(table)) == table
    back = parse_rating_table_csv(dump_rating_table_csv(table), name="prop", description=description, source=source)
    assert back == table


# --------------------------------------------------------------------------- CSV round trips


@pytest.mark.parametrize("path", sorted(RATINGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_table_csv_round_trip_is_exact(path: Path) -> None:
    table = load_rating_table(path)
    text = dump_rating_table_csv(table)
    assert parse_rating_table_csv(text, name=table.name, description=table.description, source=table.source) == table


def test_measured_table_csv_round_trip_is_exact() -> None:
    table = measured_table()
    text = dump_rating_table_csv(table)
    back = parse_rating_table_csv(text, name=table.name, description=table.description, source=table.source)
    assert back == table


def test_csv_header_is_the_documented_columns() -> None:
    header = dump_rating_table_csv(measured_table()).splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    assert header[:9] == ["algorithm", "confidentiality", "integrity", "key_exchange", "post_quantum",
                          "performance", "requirement", "source", "reason"]


def test_csv_empty_cell_means_absent() -> None:
    text = dump_rating_table_csv(measured_table())
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[1]["confidentiality"] == ""
    assert rows[1]["a_ns_per_byte"] == ""
    sha256 = parse_rating_table_csv(text, name="t").ratings["sha256"]
    assert sha256.confidentiality is None
    assert sha256.measurement == Measurement(throughput_mbps=324.0)


def test_csv_columns_may_be_a_subset_in_any_order() -> None:
    table = parse_rating_table_csv("performance,algorithm,integrity\n6,sha1,5\n\n3,sha256,8\n", name="hand-made")
    assert table.ratings["sha1"] == Rating(algorithm="sha1", integrity=5, performance=6.0)
    assert list(table.ratings) == ["sha1", "sha256"]


def test_csv_byte_order_mark_is_ignored() -> None:
    table = parse_rating_table_csv("\ufeffalgorithm,integrity,performance\nsha1,5,6\n", name="excel")
    assert "sha1" in table.ratings


# --------------------------------------------------------------------------- bad YAML


def test_bad_yaml_is_invalid_rating_table_naming_the_line() -> None:
    with pytest.raises(InvalidRatingTable, match="at line 4, column 19: mapping values are not allowed") as info:
        parse_rating_table_yaml("name: x\nratings:\n  - algorithm: aes128\n    performance: 8: 9\n")
    assert isinstance(info.value.__cause__, yaml.YAMLError)


def test_unclosed_flow_sequence_is_invalid_rating_table() -> None:
    with pytest.raises(InvalidRatingTable, match="not valid YAML"):
        parse_rating_table_yaml("ratings: [")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text", "42"])
def test_yaml_that_is_not_a_mapping_is_invalid_rating_table(text: str) -> None:
    with pytest.raises(InvalidRatingTable, match="mapping"):
        parse_rating_table_yaml(text)


def test_deeply_nested_yaml_is_invalid_not_a_crash() -> None:
    depth = 50_000
    with pytest.raises(InvalidRatingTable):
        parse_rating_table_yaml("ratings: " + "[" * depth + "]" * depth)


def test_yaml_python_tags_are_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="not valid YAML"):
        parse_rating_table_yaml("name: !!python/object/apply:os.system ['true']\nratings: []\n")


def test_yaml_with_unknown_algorithm_names_the_row() -> None:
    with pytest.raises(InvalidRatingTable, match=r"ratings\[1\].*sha265.*sha256"):
        parse_rating_table_yaml(SMALL_YAML.replace("algorithm: sha1", "algorithm: sha265"))


def test_bad_policy_yaml_is_invalid_policy_naming_the_line() -> None:
    with pytest.raises(InvalidPolicy, match="flow mapping at line 2") as info:
        parse_policy_yaml("name: p\nmin_levels: {integrity: 5\n")
    assert isinstance(info.value.__cause__, yaml.YAMLError)


# --------------------------------------------------------------------------- bad CSV


def test_csv_unterminated_quote_is_invalid_naming_the_line() -> None:
    with pytest.raises(InvalidRatingTable, match="CSV line 2") as info:
        parse_rating_table_csv('algorithm,integrity,performance,reason\nsha1,5,6,"never closed\n', name="t")
    assert isinstance(info.value.__cause__, csv.Error)


def test_csv_unknown_column_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match=r"unknown columns.*'speed'"):
        parse_rating_table_csv("algorithm,speed\nsha1,6\n", name="t")


def test_csv_without_algorithm_column_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="'algorithm' column is required"):
        parse_rating_table_csv("integrity,performance\n5,6\n", name="t")


def test_csv_repeated_column_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="appear twice"):
        parse_rating_table_csv("algorithm,integrity,integrity\nsha1,5,5\n", name="t")


def test_csv_non_integer_level_names_line_and_column() -> None:
    with pytest.raises(InvalidRatingTable, match=r"CSV line 3, column 'integrity': '5.5' is not an integer"):
        parse_rating_table_csv("algorithm,integrity,performance\nsha256,8,3\nsha1,5.5,6\n", name="t")


def test_csv_non_number_performance_names_line_and_column() -> None:
    with pytest.raises(InvalidRatingTable, match=r"CSV line 2, column 'performance'"):
        parse_rating_table_csv("algorithm,integrity,performance\nsha1,5,fast\n", name="t")


def test_csv_too_many_cells_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="CSV line 2: 4 cells but 3 columns"):
        parse_rating_table_csv("algorithm,integrity,performance\nsha1,5,6,extra\n", name="t")


def test_csv_row_errors_name_the_line() -> None:
    with pytest.raises(InvalidRatingTable, match=r"CSV line 3.*level is an integer from 0 to 10"):
        parse_rating_table_csv("algorithm,integrity,performance\nsha256,8,3\nsha1,11,6\n", name="t")


def test_csv_duplicate_row_names_both_lines() -> None:
    with pytest.raises(InvalidRatingTable, match="CSV line 3: sha1 is rated twice \\(first on line 2\\)"):
        parse_rating_table_csv("algorithm,integrity,performance\nsha1,5,6\nsha,5,6\n", name="t")


def test_csv_with_header_only_is_an_empty_table() -> None:
    with pytest.raises(InvalidRatingTable, match="non-empty"):
        parse_rating_table_csv("algorithm,integrity,performance\n", name="t")


def test_empty_csv_has_no_header() -> None:
    with pytest.raises(InvalidRatingTable, match="no header"):
        parse_rating_table_csv("", name="t")


def test_csv_measurement_a_without_b_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="come together"):
        parse_rating_table_csv("algorithm,integrity,performance,a_ns_per_byte\nsha1,5,6,1.5\n", name="t")


# --------------------------------------------------------------------------- size cap


def test_yaml_text_over_the_cap_is_refused_before_parsing() -> None:
    text = SMALL_YAML + "#" * MAX_DOCUMENT_BYTES
    with pytest.raises(InvalidRatingTable, match="larger than"):
        parse_rating_table_yaml(text)


def test_yaml_cap_counts_utf8_bytes_not_characters() -> None:
    comment = "# " + "é" * (MAX_DOCUMENT_BYTES // 2) + "\n"  # fewer characters than the cap, more bytes
    assert len(comment) < MAX_DOCUMENT_BYTES < len(comment.encode())
    with pytest.raises(InvalidRatingTable, match="larger than"):
        parse_rating_table_yaml(comment + SMALL_YAML)


def test_text_just_under_the_cap_is_accepted() -> None:
    padding = MAX_DOCUMENT_BYTES - len(SMALL_YAML) - 2
    assert parse_rating_table_yaml(SMALL_YAML + "#" + "x" * padding + "\n").name == "lab-small"


def test_csv_text_over_the_cap_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="larger than"):
        parse_rating_table_csv("algorithm\n" + "sha1\n" * (MAX_DOCUMENT_BYTES // 5 + 1), name="t")


def test_policy_text_over_the_cap_is_refused() -> None:
    with pytest.raises(InvalidPolicy, match="larger than"):
        parse_policy_yaml("name: p\n" + "#" * MAX_DOCUMENT_BYTES)


def test_file_over_the_cap_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "huge.yaml", SMALL_YAML + "#" * MAX_DOCUMENT_BYTES)
    with pytest.raises(InvalidRatingTable, match=r"huge\.yaml: larger than"):
        load_rating_table(path)


def test_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(InvalidPolicy, match=r"latin1\.yaml: not UTF-8"):
        load_policy(path)


# --------------------------------------------------------------------------- files and directories


def test_load_rating_table_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", "name: broken\nratings: [\n")
    with pytest.raises(InvalidRatingTable, match=r"^broken.yaml: not valid YAML"):
        load_rating_table(path)


def test_load_rating_tables_error_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", SMALL_YAML.replace("lab-small", "a"))
    write(tmp_path, "b.yaml", SMALL_YAML.replace("lab-small", "b").replace("integrity: 5", "integrity: 12"))
    with pytest.raises(InvalidRatingTable, match=r"^b.yaml: .*integrity"):
        load_rating_tables(tmp_path)


def test_load_rating_tables_sorts_by_name_and_ignores_other_files(tmp_path: Path) -> None:
    write(tmp_path, "1.yaml", SMALL_YAML.replace("lab-small", "zulu"))
    write(tmp_path, "2.yml", SMALL_YAML.replace("lab-small", "alpha"))
    write(tmp_path, "README.md", "not a table")
    assert [t.name for t in load_rating_tables(tmp_path)] == ["alpha", "zulu"]


def test_load_rating_tables_refuses_two_files_with_one_name(tmp_path: Path) -> None:
    write(tmp_path, "one.yaml", SMALL_YAML)
    write(tmp_path, "two.yaml", SMALL_YAML)
    with pytest.raises(InvalidRatingTable, match=r"two\.yaml: 'lab-small' is defined in one\.yaml already"):
        load_rating_tables(tmp_path)


def test_table_without_name_takes_the_file_stem(tmp_path: Path) -> None:
    path = write(tmp_path, "from-stem.yaml", SMALL_YAML.replace("name: lab-small\n", ""))
    assert load_rating_table(path).name == "from-stem"


def test_policy_without_name_takes_the_file_stem(tmp_path: Path) -> None:
    path = write(tmp_path, "branch.yaml", "min_levels: {integrity: 5}\n")
    assert load_policy(path).name == "branch"


def test_load_policies_error_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, "good.yaml", "name: good\n")
    write(tmp_path, "bad.yaml", "name: bad\nobjective_id: 7\n")
    with pytest.raises(InvalidPolicy, match=r"^bad.yaml: objective_id"):
        load_policies(tmp_path)


def test_load_policies_sorts_by_name(tmp_path: Path) -> None:
    write(tmp_path, "x.yaml", "name: zz\n")
    write(tmp_path, "y.yaml", "name: aa\n")
    assert [p.name for p in load_policies(tmp_path)] == ["aa", "zz"]


def test_missing_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="nowhere"):
        load_rating_tables(tmp_path / "nowhere")


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_policy_yaml_round_trip_is_exact(path: Path) -> None:
    policy = load_policy(path)
    assert parse_policy_yaml(dump_policy_yaml(policy)) == policy


def test_full_policy_round_trip_is_exact() -> None:
    policy = Policy.from_dict({
        "name": "everything", "description": "all: fields\nset", "min_levels": {"confidentiality": 8},
        "objectives": ["O.Non-repudiation"], "objective_id": 3, "allow": ["aes", "sha"], "deny": ["md5"],
        "traffic": {"packet_size": 160, "min_throughput_mbps": 2.5}, "mode": "transport", "pfs": False,
        "strict": True, "rating_table": "esaf-2006", "ike_lifetime": 3600, "child_lifetime": 600,
    })
    assert parse_policy_yaml(dump_policy_yaml(policy)) == policy


def test_policy_dump_leaves_out_unset_fields() -> None:
    doc = yaml.safe_load(dump_policy_yaml(Policy.from_dict({"name": "bare"})))
    assert "allow" not in doc
    assert "traffic" not in doc
    assert doc["name"] == "bare"


def test_parse_policy_name_argument_overrides_the_document() -> None:
    assert parse_policy_yaml("name: a\n", name="b").name == "b"


@pytest.mark.parametrize("module", [files, rating_csv, yaml_dialect], ids=lambda m: m.__name__)
def test_module_exports_only_what_it_documents(module: ModuleType) -> None:
    public = {n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
              and getattr(getattr(module, n), "__module__", "") == module.__name__}
    assert public <= set(module.__all__)


_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" \
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"


def test_every_yaml_reader_refuses_aliases_and_deep_nesting(tmp_path: Path) -> None:
    # Not only the API: `qoss ratings import` and files on disk come through the same loader.
    with pytest.raises(InvalidRatingTable, match="aliases"):
        files.parse_rating_table_yaml(_BOMB)
    deep = "name: t\nratings: " + "[" * 40 + "]" * 40 + "\n"
    with pytest.raises(InvalidRatingTable, match="nested deeper"):
        files.parse_rating_table_yaml(deep)
    policy = tmp_path / "bomb.yaml"
    policy.write_text("name: bomb\n" + _BOMB)
    with pytest.raises(InvalidPolicy, match="aliases"):
        files.load_policy(policy)
