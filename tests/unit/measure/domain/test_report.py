"""The report's pure part on recorded data: documents, today's figures, ranks, flips, Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.errors import InvalidInput
from app.measure.domain.comparison import (
    compare,
    esp_keywords,
    explain_flip,
    today_from_micro,
    today_from_tunnel,
    tunnel_spreads,
)
from app.measure.domain.report import render_markdown
from app.measure.domain.runs import parse_micro, parse_tunnel
from app.measure.domain.seed_tables import SEED_TABLES, SeedRow, SeedTable

DATA = Path(__file__).parents[1] / "adapters" / "data"
FLAGS = frozenset({"aes", "sha_ni", "pclmulqdq"})


def _micro() -> Any:
    return json.loads((DATA / "micro_recorded.json").read_text())


def _tunnel() -> Any:
    return json.loads((DATA / "tunnel_lab_first.json").read_text())


def _table(key: str) -> SeedTable:
    return next(t for t in SEED_TABLES if t.key == key)


def test_parse_micro_reads_the_recorded_run() -> None:
    run = parse_micro(_micro())
    assert run.machine.startswith("AMD EPYC")
    gcm = run.get("aes128gcm16")
    assert gcm is not None
    assert sorted(gcm.ns_by_size) == [64, 300, 700, 1400]
    assert gcm.mb_per_s == pytest.approx(1696.5, rel=0.001)
    modp = run.get("modp8192")
    assert modp is not None
    assert modp.ops_per_s == 65
    assert run.get("nothing") is None


def test_parse_micro_takes_the_older_document_without_kind() -> None:
    doc = _micro()
    old = {"machine": doc["machine"], "results": doc["results"][:2]}
    assert len(parse_micro(old).results) == 2
    assert parse_micro(old).date is None


@pytest.mark.parametrize("doc", [
    [], {"results": []}, {"kind": "qoss-bench-tunnel", "results": [{}]},
    {"results": [{"algorithm": "aes128", "ns": {"64": 1.0}}]},
    {"results": [{"algorithm": "aes128", "ns": {"x": 1.0, "1400": 2.0}}]},
    {"results": [{"algorithm": "aes128", "ns": {"64": "fast", "1400": 2.0}}]},
    {"results": [{"algorithm": 7, "ops_per_s": 1.0}]},
])
def test_parse_micro_refuses_what_is_not_a_micro_document(doc: Any) -> None:
    with pytest.raises(InvalidInput):
        parse_micro(doc)


def test_parse_tunnel_reads_the_agreed_format_with_every_key() -> None:
    doc = {"kind": "qoss-bench-tunnel", "version": 1, "machine": "m", "backend": "kernel-libipsec",
           "date": "2026-11-23", "repetitions": 3, "duration_s": 2.0,
           "baseline": {"throughput_mbps": {"median": 900.0, "spread": 0.03, "samples": [890.0, 900.0, 910.0]},
                        "rtt_ms": {"64": {"median": 0.05, "spread": 0.1, "samples": [0.05]}},
                        "parallel_mbps": {"1": {"median": 900.0}, "2": {"median": 950.0}, "4": {"median": 960.0}}},
           "suites": [{"esp": "aes128gcm16", "ike": "aes128gcm16-prfsha256-x25519",
                       "throughput_mbps": {"median": 400.0, "spread": 0.02, "samples": [400.0]},
                       "rtt_ms": {"1400": {"median": 0.2}}, "parallel_mbps": {"2": {"median": 420.0}}}]}
    run = parse_tunnel(doc)
    assert run.baseline is not None
    assert run.baseline.throughput is not None
    assert run.baseline.throughput.samples == (890.0, 900.0, 910.0)
    assert sorted(run.baseline.parallel) == [1, 2, 4]
    suite = run.suites[0]
    assert (suite.esp, suite.ike, suite.rtt_ms[1400].median, suite.parallel[2].median) == (
        "aes128gcm16", "aes128gcm16-prfsha256-x25519", 0.2, 420.0)


def test_parse_tunnel_tolerates_missing_optional_keys() -> None:
    run = parse_tunnel(_tunnel())
    assert run.baseline is None
    assert len(run.suites) == 10
    assert run.suites[1].ike is None
    assert run.suites[1].rtt_ms == {}
    assert parse_tunnel({"kind": "qoss-bench-tunnel"}).suites == ()
    assert run.cpus is None  # written before --cpus existed: not pinned


@pytest.mark.parametrize("doc", [
    {"kind": "qoss-bench-micro"}, {"kind": "qoss-bench-tunnel", "suites": {}},
    {"kind": "qoss-bench-tunnel", "suites": [{"throughput_mbps": {"median": 1.0}}]},
    {"kind": "qoss-bench-tunnel", "suites": [{"esp": "aes128gcm16", "throughput_mbps": {"spread": 0.1}}]},
    {"kind": "qoss-bench-tunnel", "suites": [{"esp": "aes128gcm16", "rtt_ms": {"big": {"median": 1.0}}}]},
    {"kind": "qoss-bench-tunnel", "cpus": []}, {"kind": "qoss-bench-tunnel", "cpus": 1},
    {"kind": "qoss-bench-tunnel", "cpus": ["1"]}, {"kind": "qoss-bench-tunnel", "cpus": [True]},
    {"kind": "qoss-bench-tunnel", "cpus": [-1]},
])
def test_parse_tunnel_refuses_malformed_documents(doc: Any) -> None:
    with pytest.raises(InvalidInput):
        parse_tunnel(doc)


def test_esp_keywords_canonicalise_and_drop_groups_and_flags() -> None:
    assert esp_keywords("aes128-sha2_256-modp2048-noesn") == {"aes128", "sha256"}
    assert esp_keywords("AES128GCM16-x25519") == {"aes128gcm16"}
    assert esp_keywords("null-sha256") == {"sha256"}


def test_today_from_micro_adds_the_costs_of_a_rows_transforms() -> None:
    micro = parse_micro(_micro())
    today = today_from_micro(_table("004-T5"), micro)
    aes, sha1 = micro.get("aes128"), micro.get("sha1")
    assert aes is not None
    assert sha1 is not None
    assert today["AES128-SHA1 160"] == pytest.approx(1400 / (aes.ns_by_size[1400] + sha1.ns_by_size[1400]) * 1000)
    assert today["AES128CBC-NULL"] == pytest.approx(aes.mb_per_s)
    assert today["No IPSec"] is None  # only a tunnel measures the baseline
    assert today_from_micro(_table("000-T8"), micro)["DES"] is None  # the library has no single DES


def test_table_8_order_holds_today() -> None:
    c = compare(_table("000-T8"), today_from_micro(_table("000-T8"), parse_micro(_micro())), source="micro",
                cpu_flags=FLAGS)
    assert (c.agree, len(c.flips), len(c.seed_ties), len(c.today_ties)) == (9, 0, 1, 0)
    ranks = {rc.row.label: (rc.seed_rank, rc.today_rank) for rc in c.rows}
    assert ranks["AES-128"] == (1, 1)
    assert ranks["Blowfish-128"][0] == ranks["Blowfish-192"][0] == 3  # the paper's tie shares a rank
    assert ranks["DES"] == (5, None)


def test_table_14_authentication_flips_on_sha_extensions() -> None:
    table = _table("000-T14-auth")
    c = compare(table, today_from_micro(table, parse_micro(_micro())), source="micro", cpu_flags=FLAGS)
    flipped = {(f.faster_now.label, f.faster_then.label) for f in c.flips}
    assert flipped == {("HMAC-SHA-1", "HMAC-MD5"), ("HMAC-SHA-2-256", "HMAC-MD5")}
    assert all("sha_ni" in f.why for f in c.flips)
    assert c.agree == 1  # SHA-1 still ahead of SHA-256


def test_seed_004_table_5_flips_and_ties_against_the_micro() -> None:
    table = _table("004-T5")
    c = compare(table, today_from_micro(table, parse_micro(_micro())), source="micro", cpu_flags=FLAGS)
    flipped = {(f.faster_now.label, f.faster_then.label): f.why for f in c.flips}
    assert set(flipped) == {("AES128-GCM16", "AES128CBC-NULL"), ("AES128-CCM16", "AES128-SHA1 160")}
    assert "GCM" in flipped[("AES128-GCM16", "AES128CBC-NULL")]
    assert [(a.label, b.label) for a, b in c.today_ties] == [("AES128-SHA1 160", "AES128-SHA2 256")]
    assert (c.agree, c.compared) == (7, 10)


def test_tunnel_figures_rank_the_suites_they_measured() -> None:
    tunnel = parse_tunnel(_tunnel())
    t10 = _table("000-T10")
    today = today_from_tunnel(t10, tunnel)
    assert today["AES-128 + SHA-2-256"] == 324
    assert today["AES-192 + MD5"] is None
    c = compare(t10, today, source="tunnel", cpu_flags=FLAGS)
    assert {(f.faster_now.label, f.faster_then.label) for f in c.flips} == {
        ("AES-128 + SHA-1", "AES-128 + MD5"), ("AES-128 + SHA-2-256", "AES-128 + MD5"),
        ("AES-128 + SHA-2-256", "Blowfish-128 + SHA-1")}
    mixed = next(f for f in c.flips if f.faster_then.label == "Blowfish-128 + SHA-1")
    assert "AES-NI" in mixed.why
    assert "SHA extensions" in mixed.why
    t5 = compare(_table("004-T5"), today_from_tunnel(_table("004-T5"), tunnel), source="tunnel")
    assert (t5.agree, t5.flips) == (3, ())


def test_explain_flip_names_the_mechanism_this_cpu_has() -> None:
    md5 = SeedRow("MD5", ("md5",), 9, "c")
    sha256 = SeedRow("SHA-256", ("sha256",), 3, "c")
    assert "sha_ni" in explain_flip(md5, sha256, FLAGS)
    assert "no SHA extensions" in explain_flip(md5, sha256, frozenset())
    bf128 = SeedRow("BF-128", ("blowfish128",), 6, "c")
    bf192 = SeedRow("BF-192", ("blowfish192",), 6, "c")
    assert "key size" in explain_flip(bf128, bf192, FLAGS)
    ccm = SeedRow("CCM", ("aes128ccm16",), 1, "c")
    gcm = SeedRow("GCM", ("aes128gcm16",), 1, "c")
    assert "CCM is two AES passes" in explain_flip(ccm, gcm, FLAGS)
    assert "no single known cause" in explain_flip(SeedRow("x", ("sha512",), 1, "c"),
                                                   SeedRow("y", ("sha384",), 1, "c"))


def test_markdown_has_every_section_and_the_comparison_rows() -> None:
    micro, tunnel = parse_micro(_micro()), parse_tunnel(_tunnel())
    comparisons = [compare(t, today_from_micro(t, micro), source="micro", cpu_flags=FLAGS) for t in SEED_TABLES]
    text = render_markdown(micro=micro, tunnel=tunnel, comparisons=comparisons,
                           plots={"Key exchange per group": "kex.png"}, commands=["qoss bench report --micro m"],
                           levels={"3des": 3, "md5": 2})
    for heading in ("# qoss measurements", "## Data plane (micro)", "## Key exchange", "## Tunnel",
                    "## Today beside the papers", "#### Niedermayer et al. Table 8",
                    "#### Thiruvasagam and George Table 5"):
        assert heading in text
    assert "![Key exchange per group](kex.png)" in text
    assert "| modp8192 | 65 | 15.385 |" in text
    assert "| 3DES | 2.0 | 6 |" in text  # Table 14: the paper's level and rank
    assert "| 8 | 3 |" in text  # 3DES security 2006 -> today
    assert "Sweet32" in text
    assert "| aes128-md5 | - | 276 |" in text
    missing = next(line for line in text.splitlines() if line.startswith("Catalogue algorithms this run did not"))
    assert "des, " in missing  # the recorded run is trimmed, and single DES is never measurable
    assert "prfsha256" not in missing


def test_the_tunnel_benchmarks_own_document_parses() -> None:
    # The document `qoss bench tunnel --out` writes, built by its own code: the agreed format.
    from app.measure.domain.tunnel import SuiteRun, SuiteSpec, bench_document

    base = SuiteRun(None, throughput_mbps=[900.0, 910.0, 905.0], rtt_ms={64: [0.05, 0.06]},
                    parallel_mbps={1: [900.0], 2: [950.0]})
    gcm = SuiteRun(SuiteSpec("aes128gcm16"), ike="aes128gcm16-prfsha256-x25519", throughput_mbps=[463.0, 470.0],
                   rtt_ms={1400: [0.2]})
    sha = SuiteRun(SuiteSpec("aes128", "sha256"), throughput_mbps=[324.0])
    broken = SuiteRun(SuiteSpec("3des", "sha1"))  # every repetition failed: no figures
    doc = json.loads(json.dumps(bench_document(machine="m", backend="kernel-libipsec", date="2026-11-23",
                                               repetitions=3, duration_s=2.0, baseline=base,
                                               suites=[gcm, sha, broken])))
    run = parse_tunnel(doc)
    assert run.baseline is not None
    assert run.baseline.throughput is not None
    assert run.baseline.throughput.median == 905.0
    assert [s.esp for s in run.suites] == ["aes128gcm16", "aes128-sha256", "3des-sha1"]
    assert run.suites[2].throughput is None
    today = today_from_tunnel(_table("004-T5"), run)
    assert (today["No IPSec"], today["AES128-GCM16"], today["AES128-SHA2 256"]) == (905.0, 466.5, 324.0)


def test_a_tunnel_order_within_the_repetitions_spread_is_a_tie_not_a_flip() -> None:
    table = _table("004-T5")
    doc = {"kind": "qoss-bench-tunnel", "suites": [
        {"esp": "aes128gcm16", "throughput_mbps": {"median": 302.4, "spread": 0.32}},
        {"esp": "aes128ccm16", "throughput_mbps": {"median": 374.8, "spread": 0.50}},
        {"esp": "aes128-sha256", "throughput_mbps": {"median": 167.5, "spread": 0.05}}]}
    tunnel = parse_tunnel(doc)
    spreads = tunnel_spreads(table, tunnel)
    assert spreads == {"AES128-GCM16": 0.32, "AES128-CCM16": 0.50, "AES128-SHA2 256": 0.05}
    today = today_from_tunnel(table, tunnel)
    without = compare(table, today, source="tunnel")
    assert [(f.faster_now.label, f.faster_then.label) for f in without.flips] == [("AES128-CCM16", "AES128-GCM16")]
    with_spread = compare(table, today, source="tunnel", spreads=spreads)
    assert with_spread.flips == ()
    assert [(a.label, b.label) for a, b in with_spread.today_ties] == [("AES128-GCM16", "AES128-CCM16")]
    assert with_spread.agree == 2  # both AEADs still beat AES-CBC + HMAC-SHA-256 by more than their spread


def test_markdown_says_which_rows_keep_their_place() -> None:
    micro = parse_micro(_micro())
    table = _table("000-T8")
    text = render_markdown(micro=micro, tunnel=None, comparisons=[compare(table, today_from_micro(table, micro),
                                                                          source="micro")],
                           plots={}, commands=[])
    # DES is not measured: among the other five, AES-128, AES-192 and 3DES keep their places, and
    # Blowfish-128 (162.8 MB/s) holds the third place the paper gives both Blowfish rows.
    assert "- **same place** among the rows measured both ways: AES-128, AES-192, Blowfish-128, 3DES." in text


@given(st.lists(st.floats(1.0, 1e4), min_size=15, max_size=15), st.floats(0.01, 100.0))
def test_every_pair_is_classified_once_and_a_scaled_paper_never_flips(values: list[float], scale: float) -> None:
    table = _table("000-T10")
    today: dict[str, float | None] = {r.label: v for r, v in zip(table.rows, values, strict=True)}
    c = compare(table, today, source="micro")
    assert c.compared == 15 * 14 // 2
    same = compare(table, {r.label: r.value * scale for r in table.rows}, source="micro")
    assert same.flips == ()
    assert [rc.seed_rank for rc in same.rows] == [rc.today_rank for rc in same.rows]


def test_markdown_says_when_the_charons_and_iperf3_were_pinned() -> None:
    from app.measure.domain.tunnel import SuiteRun, SuiteSpec, bench_document

    gcm = SuiteRun(SuiteSpec("aes128gcm16"), throughput_mbps=[210.0, 212.0])
    micro = parse_micro(_micro())
    texts = {}
    for cpus in (None, frozenset({1}), frozenset({0, 1})):
        doc = json.loads(json.dumps(bench_document(machine="m", backend="kernel-libipsec", date="2026-11-23",
                                                   repetitions=2, duration_s=1.0, baseline=SuiteRun(None),
                                                   suites=[gcm], cpus=cpus)))
        tunnel = parse_tunnel(doc)
        assert tunnel.cpus == (tuple(sorted(cpus)) if cpus else None)
        text = render_markdown(micro=micro, tunnel=tunnel, comparisons=[], plots={}, commands=[])
        texts[cpus] = next(line for line in text.splitlines() if line.startswith("- machine: m;"))
    assert texts[frozenset({1})] == ("- machine: m; back end: kernel-libipsec; date: 2026-11-23; 2 repetitions of "
                                     "1.0 s; charons, iperf3 and ping pinned to CPU 1")
    assert texts[frozenset({0, 1})].endswith("; charons, iperf3 and ping pinned to CPUs 0, 1")
    assert "pinned" not in texts[None]
