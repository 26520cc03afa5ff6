"""A seeded mutation fuzz of real kernel packs (issue #17): bit flips, truncation, zstd frame
header and block edits, tar header edits, huge declared sizes, hostile PAX records, spliced
blocks (``hostile_packs.MUTATIONS``).

Against the service (the app in-process: the same code ``kcache serve`` runs): no 5xx, no hang,
and nothing stored that should not be: a refused upload leaves no trace, an accepted one is a
canonical pack of exactly the original kernel's files, served back byte for byte. Against the
client's reader: a :class:`PackError` or the original files, nothing else.

Deterministic: the seed fixes every mutant. A run of ~3,000 mutants before the fix found
fourteen 500s (all tarfile's OverflowError on PAX record lengths).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from kcache_schemas import PackError, read_pack
from kcache_schemas.pack import MEDIA_TYPE, verify_pack

from kcache_testkit.kernels import Kernel
from kcache_testkit.pace import bound

pytest.register_assert_rewrite("api_helpers")

from api_helpers import inproc_client, make_settings  # noqa: E402

from kcache_testkit.hostile_packs import MUTATIONS, mutations  # noqa: E402

pytest_plugins = ["api_helpers"]

SEED = 17
COUNT = 450
# Refusals name one of these codes; anything else (internal, backend_unavailable) is a bug.
_REFUSALS = {"invalid_pack", "too_large", "key_mismatch"}


def test_fuzzed_packs_are_refused_with_4xx_or_stored_intact(tmp_path: Path, kernels: list[Kernel]) -> None:
    packs = [k.pack for k in kernels]
    outcomes: Counter[tuple[str, int]] = Counter()
    slowest = 0.0
    with inproc_client(make_settings(tmp_path / "data")) as client:
        for i, (name, origin, mutant) in enumerate(mutations(packs, COUNT, SEED)):
            kernel = kernels[origin]
            url = f"/v1/fuzz/kernels/{kernel.key}"
            where = f"mutant {i} ({name}) of {kernel.key}"

            # the client's reader: the original files or a PackError, never another exception
            try:
                manifest, files = read_pack(mutant)
            except PackError:
                pass
            else:
                assert manifest.key == kernel.key and files == kernel.files, where

            start = time.monotonic()
            resp = client.put(url, content=mutant, headers={"Content-Type": MEDIA_TYPE})
            slowest = max(slowest, time.monotonic() - start)
            assert resp.status_code < 500, (where, resp.status_code, resp.text[:300])
            outcomes[(name, resp.status_code)] += 1
            if resp.status_code in (200, 201):
                stored = client.get(url)
                assert stored.content == mutant, where
                assert verify_pack(stored.content).content_digest == kernel.manifest.content_digest, where
                assert client.delete(url).status_code == 204  # the next mutant meets an empty key
            else:
                assert 400 <= resp.status_code < 500, where
                assert resp.json()["error"]["code"] in _REFUSALS, (where, resp.text[:300])
                assert client.head(url).status_code == 404, where
        assert client.get("/v1/fuzz/kernels").json()["items"] == []

    assert slowest < bound(0, 20_000), f"a mutant took {slowest:.1f} s"  # no hang (a bound, not a timing)
    refused = Counter(name for (name, status), n in outcomes.items() for _ in range(n) if status >= 400)
    assert set(refused) == set(MUTATIONS), outcomes  # every mutation produced refusals
    assert sum(refused.values()) > COUNT * 0.8, outcomes
