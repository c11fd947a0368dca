"""Shared fixtures for the whole suite (a plugin imported by another is listed before it)."""

pytest_plugins = ["pytester", "tests.fixtures.figures", "tests.fixtures.secrets", "tests.fixtures.db",
                  "tests.fixtures.sa_events", "tests.fixtures.state"]
