"""Measurement rules: pure, standard library only."""
