"""choice_quality's statistics: the cross-validated chosen/best (unbiased where the ratio of
medians, best picked on the same samples, is biased low) and what a perfect choice would score."""

from __future__ import annotations

import random
import statistics

from benchmarks.choice_quality import GOAL, cross_validated, perfect_choice


def rounds_for(means: dict[str, float], n: int, noise: float, rng: random.Random) -> dict[str, list[float]]:
    return {s: [rng.gauss(m, noise * m) for _ in range(n)] for s, m in means.items()}


def naive(pick: str, rounds: dict[str, list[float]]) -> float:
    medians = {s: statistics.median(v) for s, v in rounds.items()}
    return medians[pick] / max(medians.values())


def test_equal_suites_score_one_cross_validated_but_below_one_by_the_best_median() -> None:
    rng = random.Random(7)
    means = {f"s{i}": 200.0 for i in range(12)}
    cv, biased = [], []
    for _ in range(300):
        rounds = rounds_for(means, 9, 0.08, rng)
        cv.append(cross_validated("s0", list(means), rounds))
        biased.append(naive("s0", rounds))
    assert abs(statistics.fmean(cv) - 1.0) < 0.015
    assert statistics.fmean(biased) < 0.96  # the winner's curse of 12 noisy medians


def test_a_slower_choice_is_found_slower() -> None:
    rng = random.Random(11)
    means = {"chosen": 180.0, **{f"s{i}": 200.0 for i in range(5)}}
    cv = [cross_validated("chosen", list(means), rounds_for(means, 9, 0.05, rng)) for _ in range(200)]
    assert 0.87 < statistics.fmean(cv) < 0.93


def test_the_chosen_suite_alone_is_one_and_rounds_are_aligned_to_the_shortest() -> None:
    rounds = {"a": [100.0, 110.0, 90.0], "b": [50.0, 55.0]}
    assert cross_validated("a", ["a"], rounds) == 1.0
    assert cross_validated("b", ["a", "b"], rounds) == 0.5
    assert cross_validated("b", ["a", "b"], {"a": [100.0], "b": [40.0]}) == 0.4


def test_a_perfect_choice_among_many_noisy_ties_scores_below_the_goal_by_the_ratio_of_medians() -> None:
    rng = random.Random(3)
    means = {f"s{i}": 200.0 for i in range(12)}
    rounds = rounds_for(means, 9, 0.08, rng)
    floor, reach, tied = perfect_choice("s0", list(means), rounds)
    # What sampling the same 12 equal suites again and again gives by the ratio of medians:
    naive_runs = sorted(naive("s0", rounds_for(means, 9, 0.08, rng)) for _ in range(400))
    assert tied == 12
    assert floor < GOAL
    assert abs(floor - statistics.median(naive_runs)) < 0.03
    assert reach < 0.5


def test_suites_clearly_slower_than_the_best_are_not_ties_and_a_lone_choice_is_perfect() -> None:
    rng = random.Random(5)
    rounds = rounds_for({"a": 200.0, "b": 200.0, "slow": 120.0}, 9, 0.03, rng)
    _, _, tied = perfect_choice("a", ["a", "b", "slow"], rounds)
    assert tied == 2
    assert perfect_choice("slow", ["slow"], rounds) == (1.0, 1.0, 1)
    # The chosen suite always takes part, even when it is itself clearly slower.
    assert perfect_choice("slow", ["a", "b", "slow"], rounds)[2] == 3
