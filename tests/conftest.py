"""Shared fixtures for the whole suite."""

pytest_plugins = ["tests.fixtures.db", "tests.fixtures.secrets"]
