"""Shared fixtures for the whole suite (a plugin imported by another is listed before it)."""

import pytest

pytest_plugins = ["pytester", "tests.fixtures.figures", "tests.fixtures.secrets", "tests.fixtures.db",
                  "tests.fixtures.sa_events", "tests.fixtures.state"]

#: The modules that take longest on one worker (``--durations`` of a full run): handed out first,
#: so that the parallel run does not end with one worker alone on a long module.
_LONGEST_FIRST = (
    "tests/integration/test_replicas.py",
    "tests/integration/test_benchmarks_smoke.py",
    "tests/cli/test_cli.py",
    "tests/integration/test_capacity_smoke.py",
    "tests/integration/test_slow_clients_smoke.py",
    "tests/cli/test_database.py",
    "tests/integration/agent/test_device_join.py",
    "tests/integration/agent/test_agent_e2e.py",
    "tests/unit/test_secret_sweep.py",
    "tests/fuzz/test_openapi.py",
    "tests/integration/test_negotiation_bench_smoke.py",
    "tests/ui/browser/test_oidc.py",
    "tests/integration/peers/test_hub_and_spokes.py",
    "tests/integration/agent/test_device_post_quantum.py",
    "tests/integration/agent/test_my_devices.py",
    "tests/ui/browser/test_my_devices.py",
    "tests/ui/browser/test_phone_join.py",
    "tests/integration/tunnels/test_peered_killed.py",
    "tests/integration/peers/test_peered_move_killed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first, everything else in its collected order (the same on every worker)."""
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
