"""The ``qoss`` command line: one module per command group, composed in :mod:`app.cli.main`."""
