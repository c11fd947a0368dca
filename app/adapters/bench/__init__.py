"""Measurement adapters (`qoss bench`)."""
