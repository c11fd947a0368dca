"""The strongSwan lab as code: charons in throwaway network namespaces (`qoss lab`, the tests,
the benchmarks). Tooling, not part of the service."""
