"""Shared fixtures for the whole suite."""

pytest_plugins = ["pytester", "tests.fixtures.secrets", "tests.fixtures.db"]
