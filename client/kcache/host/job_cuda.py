"""Whether the job itself initialized CUDA: the moment kcache may ask torch about the GPU.

Asking torch which GPU this is initializes CUDA (a context, hundreds of MB of the GPU's memory, on
whichever device is current on the asking thread), so kcache's background threads never do it
first: they wait until the job has, which is also how they know it is a GPU job at all. (Where
``KCACHE_GPU_ARCH`` names the host's GPU, callers need not wait: ``kcache.config`` answers.)
"""

from __future__ import annotations

import threading
import time

from kcache.host.after_import import imported

# How often a waiting thread looks again whether the job initialized CUDA.
POLL_S = 0.05


def wait_for_job_cuda(stop: threading.Event, wait_s: float) -> bool:
    """True once the job has initialized CUDA; False when ``wait_s`` passed first or ``stop`` was
    set (the job is exiting)."""
    deadline = time.monotonic() + wait_s
    while not stop.is_set():
        cuda = getattr(imported("torch"), "cuda", None)
        if cuda is not None and cuda.is_initialized():
            return True
        if time.monotonic() >= deadline:
            return False
        stop.wait(POLL_S)
    return False
