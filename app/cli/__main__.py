"""``python -m app.cli``: the ``qoss`` command."""

from app.cli.main import main

main()
