"""Inductor's layers: its remote caches (FX graph, AOTAutograd, autotune, ...), the TritonBundler
hooks, raw FX-graph reads, the FX key's components, two fixes to Inductor's autotune caches, and
kcache's activation in Inductor's compile sidecar (in its pool workers, at their first job)."""
