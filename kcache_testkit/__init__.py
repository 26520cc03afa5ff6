"""What kcache's tests and benchmarks share: real Triton kernels (the corpus generator), the
``kcache serve`` launcher, free ports.

One home for both, so neither imports the other and nothing edits ``sys.path``: importable from
the repository root (pytest's ``pythonpath``, ``python -m bench.<name>``). Not part of the kcache
wheel: users never get it.
"""
