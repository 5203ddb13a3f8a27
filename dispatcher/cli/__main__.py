"""``python -m dispatcher.cli``: the same as the ``outboxd`` command."""

from dispatcher.cli.main import main

raise SystemExit(main())
