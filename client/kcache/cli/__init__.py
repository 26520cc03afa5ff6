"""The ``kcache`` command (``kcache = "kcache.cli:main"``; ``python -m kcache.cli``): thin commands
over the client (:mod:`.commands`), with shell completion, ``doctor``, the local tier's ``local``
command and progress display. The top floor: nothing of kcache imports it."""

from kcache.cli.commands import main

__all__ = ["main"]
