"""kcache's version, in one place: the package face re-exports it (``kcache.__version__``), and the
modules that send it (User-Agent, the producer header, reports, signatures) read it here. They do
not import it from the package face, whose ``install()`` reaches activation and the runtime: that
would draw every sender into a circle with the runtime."""

__version__ = "0.1.0"
