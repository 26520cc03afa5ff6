"""``python -m kcache.cli``."""

import os

os.environ.setdefault("KCACHE_AUTOLOAD", "0")

from kcache.cli.commands import main

raise SystemExit(main())
