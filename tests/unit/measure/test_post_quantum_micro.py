"""ML-KEM is measured like a key exchange, and a measured table keeps the post-quantum levels it copies."""

from __future__ import annotations

from app.adapters.files import load_rating_table
from app.domain.scoring import measured_table
from app.measure.adapters.micro import available, run_micro
from app.settings import SHIPPED_RATINGS_DIR


def test_ml_kem_768_and_1024_are_measured_as_one_encapsulation_round() -> None:
    assert {"mlkem768", "mlkem1024"} <= set(available())
    (result,) = run_micro(["mlkem768"], budget_per_algorithm=0.1, min_runs=5)
    assert result.ops_per_s is not None
    assert result.ops_per_s > 10
    assert result.method == "key generation + encapsulation + decapsulation"


def test_a_measured_table_keeps_the_post_quantum_level() -> None:
    base = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
    results = run_micro(["mlkem768", "x25519"], budget_per_algorithm=0.1, min_runs=5)
    table = measured_table(name="measured-pq", base=base, results=results, machine="test", backend="test",
                           date="2026-11-29", description="test")
    assert table.ratings["mlkem768"].post_quantum == 9
    assert table.ratings["mlkem768"].performance > 0
    assert table.ratings["x25519"].key_exchange == 8
