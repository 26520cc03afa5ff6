"""The client's local tier: bounded (least recently used first), shared safely by the processes of a
node, and scoped to the service it came from."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kcache.config import DEFAULT_LOCAL_MAX_BYTES, ClientConfig, parse_bytes
from kcache.exceptions import ConfigError
from kcache.store.local_store import LocalEntryStore

from kcache_testkit.pace import HANG_S

URL = "http://cache.example:8765"


def payload(key: str, size: int) -> bytes:
    """Bytes that say which key they belong to, so a torn or swapped file is caught."""
    head = key.encode() + b"\0"
    body = hashlib.sha256(key.encode()).digest() * (size // 32 + 1)
    return head + body[: size - len(head)]


def whole(path: Path) -> bool:
    data = path.read_bytes()
    key = data.split(b"\0", 1)[0].decode()
    return hashlib.sha256(key.encode()).hexdigest() == path.name and data == payload(key, len(data))


def entry_files(store: LocalEntryStore) -> list[Path]:
    return [p for p in store.tier.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_least_recently_used_entries_go_first_and_the_budget_holds(tmp_path: Path) -> None:
    store = LocalEntryStore(tmp_path, "ns", url=URL, max_bytes=100_000)
    keys = [f"pt2:fx-graph-v1::{i:04d}:c1" for i in range(8)]
    for k in keys:
        store.put("fx-graph", k, payload(k, 10_000))
        time.sleep(0.01)  # distinct mtimes
    assert store.usage() == 80_000 and len(entry_files(store)) == 8
    time.sleep(0.01)
    # The two oldest are read: now the most recently used (file times can be coarse: a pause each).
    for k in keys[:2]:
        assert store.get("fx-graph", k) == payload(k, 10_000)
        time.sleep(0.01)
    for i in range(8, 12):  # 40 KB more: over the budget
        k = f"pt2:fx-graph-v1::{i:04d}:c1"
        store.put("fx-graph", k, payload(k, 10_000))
        time.sleep(0.01)
    assert store.usage() <= 100_000
    assert store.get("fx-graph", keys[0]) is not None and store.get("fx-graph", keys[1]) is not None
    assert store.get("fx-graph", keys[2]) is None  # the least recently used went first
    assert all(whole(p) for p in entry_files(store))


def test_an_unbounded_tier_never_evicts(tmp_path: Path) -> None:
    store = LocalEntryStore(tmp_path, "ns", url=URL, max_bytes=None)
    for i in range(20):
        store.put("kernel", f"K{i}", payload(f"K{i}", 5_000))
    assert store.usage() == 100_000 and store.evict() == 0


def test_entries_of_another_service_are_never_served(tmp_path: Path) -> None:
    staging = LocalEntryStore(tmp_path, "ns", url="http://staging:8765")
    prod = LocalEntryStore(tmp_path, "ns", url="http://prod:8765/")
    staging.put("fx-graph", "pt2:k:c1", b"staging bytes")
    assert prod.get("fx-graph", "pt2:k:c1") is None
    assert LocalEntryStore(tmp_path, "ns", url="http://STAGING:8765/").get("fx-graph", "pt2:k:c1") == b"staging bytes"
    assert LocalEntryStore(tmp_path, "other-ns", url="http://staging:8765").get("fx-graph", "pt2:k:c1") is None


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from test_local_store import payload
    from kcache.store.local_store import LocalEntryStore
    store = LocalEntryStore(Path(sys.argv[1]), "ns", url="http://shared", max_bytes=int(sys.argv[2]))
    for i in range(int(sys.argv[3])):
        key = f"pt2:{sys.argv[4]}:{i}:c1"
        store.put("fx-graph", key, payload(key, 7_000))
        other = f"pt2:{sys.argv[5]}:{i}:c1"
        data = store.get("fx-graph", other)
        assert data is None or data == payload(other, 7_000), "a torn or foreign entry was served"
    """
)


@pytest.mark.slow
def test_processes_sharing_a_tier_keep_it_bounded_and_whole(tmp_path: Path) -> None:
    budget, procs, each = 200_000, 4, 60  # 4 x 60 x 7 KB = 1.7 MB written into a 200 KB tier
    names = [f"p{i}" for i in range(procs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    running = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(budget), str(each), names[i], names[(i + 1) % procs]],
            env=env, stderr=subprocess.PIPE,
        )
        for i in range(procs)
    ]
    for p in running:
        _out, err = p.communicate(timeout=HANG_S)
        assert p.returncode == 0, err.decode()[-2000:]
    store = LocalEntryStore(tmp_path, "ns", url="http://shared", max_bytes=budget)
    files = entry_files(store)
    assert files and all(whole(p) for p in files)
    # Each process looks again after writing a tenth of the budget: between looks the others
    # may add theirs, never more than that share each.
    assert store.usage() <= budget * (1 + 0.1 * procs) + procs * 7_000
    store.evict()
    assert store.usage() <= budget
    assert not [p for p in store.tier.rglob(".tmp-*")], "a writer left a temp file"


def test_the_budget_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parse_bytes("10G") == 10 << 30 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("1.5k") == 1536
    assert parse_bytes("4096") == 4096
    with pytest.raises(ValueError):
        parse_bytes("lots")
    monkeypatch.delenv("KCACHE_LOCAL_MAX_BYTES", raising=False)
    assert ClientConfig.from_env().local_max_bytes == DEFAULT_LOCAL_MAX_BYTES
    monkeypatch.setenv("KCACHE_LOCAL_MAX_BYTES", "64M")
    monkeypatch.setenv("KCACHE_LOCAL_DIR", str(tmp_path))
    cfg = ClientConfig.from_env(url=URL)
    assert cfg.local_max_bytes == 64 << 20 and LocalEntryStore.of(cfg).max_bytes == 64 << 20
    monkeypatch.setenv("KCACHE_LOCAL_MAX_BYTES", "0")
    assert LocalEntryStore.of(ClientConfig.from_env(url=URL)).max_bytes is None  # 0: unbounded
    monkeypatch.setenv("KCACHE_LOCAL_MAX_BYTES", "lots")
    with pytest.raises(ConfigError, match="KCACHE_LOCAL_MAX_BYTES='lots': not a size"):
        ClientConfig.from_env()  # never silently the default (tests/test_settings.py: what install() and autoload do)


HOLD_KEY_LOCK = """
import sys, time
from pathlib import Path
from kcache.store.local_store import LocalEntryStore
lock = LocalEntryStore(Path(sys.argv[1]), "ns", url=sys.argv[2]).lock("fx-graph", "pt2:k:c1", 0)
print("HELD" if lock.held else "NOT HELD", flush=True)
time.sleep(3600)
"""


def test_a_key_lock_has_one_holder_and_goes_with_a_holder_that_dies(tmp_path: Path) -> None:
    """The node's per-key fetch lock (issue #31): another process holding it makes a waiter give
    up after its wait (and go on without it: fail-open); SIGKILL of the holder frees it."""
    store = LocalEntryStore(tmp_path, "ns", url=URL)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_KEY_LOCK, str(tmp_path), URL], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        waited = store.lock("fx-graph", "pt2:k:c1", 0.2)
        assert not waited.held
        waited.release()  # harmless: it holds nothing
        with store.lock("fx-graph", "pt2:other:c1", 0) as other:  # other keys are not blocked
            assert other.held
    finally:
        holder.kill()
        holder.wait()
    with store.lock("fx-graph", "pt2:k:c1", 60) as taken:  # the kernel released the dead holder's lock
        assert taken.held
    assert not any(p.is_file() for p in store.tier.rglob("*"))  # locks live outside the LRU tier


def test_the_prefetch_claim_is_one_per_workload_and_environment(tmp_path: Path) -> None:
    store = LocalEntryStore(tmp_path, "ns", url=URL)
    with store.prefetch_claim("train", "fp1") as first:
        assert first.held
        assert not store.prefetch_claim("train", "fp1").held  # a second claimant (another descriptor)
        with store.prefetch_claim("train", "fp2") as other_env, store.prefetch_claim("serve", "fp1") as other_name:
            assert other_env.held and other_name.held
    with store.prefetch_claim("train", "fp1") as again:
        assert again.held
