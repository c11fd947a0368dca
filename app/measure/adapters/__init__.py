"""Measurement on this machine: OpenSSL micro benchmarks, tunnels, plots."""
