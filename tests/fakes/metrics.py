"""An in-memory :class:`~app.domain.ports.Metrics`: keeps what it is told, and refuses what
the Prometheus adapter would refuse (a name outside its catalogue, other labels, a wrong kind)."""

from __future__ import annotations

from collections import defaultdict

from app.adapters.metrics import CATALOGUE

__all__ = ["RecordingMetrics"]

Key = tuple[str, tuple[tuple[str, str], ...]]


class RecordingMetrics:
    """``counts[(name, labels)]`` and ``observed[(name, labels)]``, labels as sorted pairs."""

    def __init__(self) -> None:
        self.counts: dict[Key, float] = defaultdict(float)
        self.observed: dict[Key, list[float]] = defaultdict(list)

    @staticmethod
    def _key(name: str, kind: str, labels: dict[str, str]) -> Key:
        spec = CATALOGUE[name]
        assert spec.kind == kind, f"{name} is a {spec.kind}"
        assert set(labels) == set(spec.labels), f"{name} takes {spec.labels}, got {sorted(labels)}"
        assert all(isinstance(v, str) for v in labels.values()), labels
        return name, tuple(sorted(labels.items()))

    def count(self, name: str, /, amount: float = 1.0, **labels: str) -> None:
        self.counts[self._key(name, "counter", labels)] += amount

    def observe(self, name: str, value: float, /, **labels: str) -> None:
        self.observed[self._key(name, "histogram", labels)].append(value)

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s counts over every series whose labels include ``labels``."""
        return sum(v for (n, pairs), v in self.counts.items()
                   if n == name and set(labels.items()) <= set(pairs))
