"""A user's job, run by the host-safety suite as a fresh interpreter, exactly as a user runs it.

kcache activates from the environment at interpreter start (``kcache_autoload.pth``); nothing
here waits for kcache's threads, sets a cache dir, or orders imports to suit kcache. ``HOST_JOB``
picks what the job does:

* ``import``     ``import torch`` and exit (races the workload prefetcher started at start-up)
* ``compile``    one ``torch.compile`` call, print its result, exit at once
* ``install``    ``kcache.install()`` first thing, then ``compile`` (``KCACHE_AUTOLOAD=0`` jobs)
* ``reinstall``  ``compile``, then ``kcache.install(namespace=...)`` and a second function
* ``uninstall``  ``compile``, ``kcache.uninstall()``, a second function, ``kcache.install()``, a third

``HOST_JOB_INDUCTOR_CONFIG=name=1,...`` sets Inductor config flags in code before compiling, as a
user's script does (``torch._inductor.config.fallback_random = True``).

It prints ``RESULT <json>``: the outputs, rounded, so a run with kcache can be compared with one
without.
"""

from __future__ import annotations

import json
import os
import sys

job = os.environ.get("HOST_JOB", "compile")
if job == "install":
    import kcache

    kcache.install()

import torch  # noqa: E402

if job == "import":
    print("RESULT " + json.dumps({"torch": torch.__version__.split("+")[0]}))
    sys.exit(0)


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ y).sum(dim=-1) * 2 + x.mean()


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x).cumsum(0) - x.max()


def h(x: torch.Tensor) -> torch.Tensor:
    return (x * x).softmax(dim=-1)


for setting in filter(None, os.environ.get("HOST_JOB_INDUCTOR_CONFIG", "").split(",")):
    import torch._inductor.config

    name, _, value = setting.partition("=")
    setattr(torch._inductor.config, name, value == "1")

torch.manual_seed(0)
x, y = torch.randn(32, 32), torch.randn(32, 32)
results = {"f": torch.compile(f)(x, y)}
if job == "reinstall":
    import kcache

    kcache.install(namespace=os.environ.get("HOST_JOB_NAMESPACE", "second"))
    results["g"] = torch.compile(g)(x)
elif job == "uninstall":
    import kcache

    kcache.uninstall()
    results["g"] = torch.compile(g)(x)
    kcache.install()
    results["h"] = torch.compile(h)(x)
print("RESULT " + json.dumps({k: [round(v, 4) for v in t.flatten().tolist()] for k, t in results.items()}))
