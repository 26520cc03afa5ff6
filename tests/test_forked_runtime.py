"""A forked child gets its own runtime (vLLM forks its engine core and workers where CUDA is not
initialised yet): the parent's object has no threads in the child (its uploader and prefetcher
stayed in the parent) and its HTTP connections are the parent's. Real interpreters, a real
service, kcache started as a job starts it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache_testkit.pace import HANG_S
from kcache_testkit.service import clean_env, with_testkit

pytest_plugins = ["live"]
pytestmark = [pytest.mark.slow, pytest.mark.one_torch]  # a job interpreter; nothing checked depends on torch

FORK_SCRIPT = textwrap.dedent('''
    import multiprocessing, os, sys
    from kcache.config import ClientConfig
    from kcache.current import ensure_runtime, get_runtime

    parent = ensure_runtime(ClientConfig(url=sys.argv[1], workload="forked"))
    parent.put_entry("jit", "from-the-parent", b"p" * 64, now=True)  # a connection in the pool

    def child(name):
        rt = get_runtime()
        assert rt is not None and rt is not parent, "the parent's runtime"
        assert rt.uploader is not None and rt.uploader._thread.is_alive(), "no uploader thread"
        rt.put_entry("jit", name, b"c" * 64)  # queued: sent by the child's uploader, flushed at its exit

    # multiprocessing ends a forked child with os._exit (no atexit); a plain fork returns normally
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=child, args=("from-a-multiprocessing-child",))
    proc.start(); proc.join()
    pid = os.fork()
    if pid == 0:
        child("from-a-forked-child")
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("EXIT", proc.exitcode, os.waitstatus_to_exitcode(status))
''')


def test_a_forked_child_runs_its_own_runtime_and_hands_over_at_exit(live_service, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(FORK_SCRIPT)
    proc = subprocess.run([sys.executable, str(job), live_service.url], env=with_testkit(clean_env(HOME=str(tmp_path))),
                          capture_output=True, text=True, timeout=HANG_S)
    assert "EXIT 0 0" in proc.stdout, proc.stdout + proc.stderr
    from kcache.config import ClientConfig
    from kcache.transport.http import KcacheClient

    client = KcacheClient(ClientConfig(url=live_service.url, read_timeout_s=HANG_S))
    for key in ("from-the-parent", "from-a-multiprocessing-child", "from-a-forked-child"):
        data, _ = client.get_entry("jit", key)
        assert data[:1] in (b"p", b"c"), key
