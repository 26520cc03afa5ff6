"""kcache client."""
