"""Repeated refusals: the first of a kind at once, the rest one counted entry per window, in bounded memory."""

from __future__ import annotations

from typing import Any

from app.adapters.db.refusals import RefusalDigest, more_refusals


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def refusal(n: int, *, source: str = "192.0.2.1", outcome: int = 401, action: str = "POST",
            token_id: str | None = None) -> dict[str, Any]:
    return {"request_id": f"r{n}", "source": source, "outcome": outcome, "action": action,
            "object": f"/v1/policies/p{n}", "token_id": token_id, "detail": "Unauthenticated"}


def test_the_first_is_written_at_once_and_the_rest_as_one_entry_when_the_window_closes() -> None:
    clock, written = Clock(), []
    digest = RefusalDigest(written.append, window=60, clock=clock)
    for n in range(300):
        clock.now = n * 0.1
        digest.refused(refusal(n), route="/v1/policies/{name}")
    assert [w["request_id"] for w in written] == ["r0"]
    assert digest.close_due() == 0
    clock.now = 60.0
    assert digest.close_due() == 1
    summary = written[1]
    assert summary["detail"] == "299 more refusals like request r0 within 30 s; Unauthenticated"
    assert (summary["request_id"], summary["object"]) == ("r299", "/v1/policies/p299")  # the last one's
    assert more_refusals(summary["detail"]) == 299
    assert more_refusals(written[0]["detail"]) == 0
    assert len(digest) == 0
    digest.refused(refusal(300), route="/v1/policies/{name}")  # a new window: written at once
    assert written[-1]["request_id"] == "r300"


def test_a_window_with_nothing_more_writes_nothing_more() -> None:
    clock, written = Clock(), []
    digest = RefusalDigest(written.append, window=1, clock=clock)
    digest.refused(refusal(0), route="/v1/policies")
    clock.now = 5
    assert digest.close_all() == 0
    assert [w["request_id"] for w in written] == ["r0"]


def test_kinds_are_source_outcome_method_route_and_token() -> None:
    clock, written = Clock(), []
    digest = RefusalDigest(written.append, window=60, clock=clock)
    kinds = [refusal(1), refusal(2, source="192.0.2.2"), refusal(3, outcome=403), refusal(4, action="GET"),
             refusal(5, token_id="abc"), refusal(6, action="BREW"), refusal(7, action="SPILL")]
    for fields in kinds:
        digest.refused(fields, route="/v1/policies")
    digest.refused(refusal(8), route="/v1/tunnels")
    assert [w["request_id"] for w in written] == ["r1", "r2", "r3", "r4", "r5", "r6", "r8"]  # BREW, SPILL: other
    digest.refused(refusal(9, source="2001:db8::1"), route="/v1/policies")
    digest.refused(refusal(10, source="2001:db8::2"), route="/v1/policies")  # the same /64
    assert written[-1]["request_id"] == "r9"
    assert digest.close_all() == 2
    assert [more_refusals(w["detail"]) for w in written[-2:]] == [1, 1]
    assert written[-2]["detail"].startswith("1 more refusal like request r6 ")


def test_past_the_cap_the_oldest_window_is_closed_early() -> None:
    clock, written = Clock(), []
    digest = RefusalDigest(written.append, window=60, max_keys=100, clock=clock)
    for n in range(10_000):  # one source after another, each twice
        for _ in range(2):
            digest.refused(refusal(n, source=f"10.0.{n // 256}.{n % 256}"), route="/v1/policies")
        assert len(digest) <= 100
    digest.close_all()
    assert len(written) == 20_000
    assert sum(more_refusals(w["detail"]) or 1 for w in written) == 20_000


def test_a_long_detail_is_cut_to_the_column() -> None:
    written: list[dict[str, Any]] = []
    digest = RefusalDigest(written.append, window=60)
    for n in range(2):
        digest.refused({**refusal(n), "detail": "x" * 200}, route="/v1/policies")
    digest.close_all()
    assert len(written[1]["detail"]) == 200
    assert more_refusals(written[1]["detail"]) == 1
