"""benchmarks.hybrid_seal runs to its end at a tiny size and reports both modes of each message
(nothing about the times is asserted: the machine is shared)."""

from __future__ import annotations

from benchmarks.hybrid_seal import measure, report


def test_the_hybrid_seal_benchmark_reports_both_modes_of_each_message() -> None:
    rows = measure(3, 1, 30.0)
    assert [(r["message"].split()[0], r["mode"]) for r in rows] == [  # type: ignore[attr-defined]
        (m, mode) for m in ("request", "endorse", "answer") for mode in ("x25519", "hybrid")]
    sizes = {(r["message"], r["mode"]): r["wire_bytes"] for r in rows}
    for message in {r["message"] for r in rows}:
        # The 1,088-byte ML-KEM-768 ciphertext, in base64url on the wire.
        assert sizes[(message, "hybrid")] - sizes[(message, "x25519")] in (1450, 1451)  # type: ignore[operator]
    assert report(rows).count("hybrid - x25519") == 3
