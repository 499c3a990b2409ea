"""``python -m collcomm ...`` is the ``collcomm`` command."""
from .tools.cli import main

raise SystemExit(main())
