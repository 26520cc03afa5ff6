"""kcache service: the FastAPI app, auth, storage backends and metrics."""

__version__ = "0.1.0"
