"""The ``jit`` layer: native modules JIT builders compile (Inductor's C++ builds, torch's
cpp_extension, tvm-ffi), served under content keys; one adapter per builder."""
