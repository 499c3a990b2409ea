"""``python -m collcomm ...`` is the ``collcomm`` command."""
from .cli import main

raise SystemExit(main())
