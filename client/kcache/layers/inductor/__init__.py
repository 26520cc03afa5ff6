"""Inductor's layers: its remote caches (FX graph, AOTAutograd, autotune, ...), the TritonBundler
hooks, raw FX-graph reads, the FX key's components, and two fixes to Inductor's autotune caches."""
