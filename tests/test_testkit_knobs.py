"""The suite's own settings (kcache_testkit.knobs) refuse what does not parse, naming the variable:
a typo in a run budget must not change how often the race tests run."""

from __future__ import annotations

import pytest

from kcache_testkit import knobs


def test_a_count_is_a_whole_number_of_at_least_one() -> None:
    assert knobs.count("KCACHE_HOST_SAFETY_RUNS", 20, {}) == 20
    assert knobs.count("KCACHE_HOST_SAFETY_RUNS", 20, {"KCACHE_HOST_SAFETY_RUNS": " 3 "}) == 3
    for bad in ("twenty", "2.5", "", "0", "-1"):
        with pytest.raises(knobs.KnobError, match="KCACHE_HOST_SAFETY_RUNS"):
            knobs.count("KCACHE_HOST_SAFETY_RUNS", 20, {"KCACHE_HOST_SAFETY_RUNS": bad})


def test_a_switch_is_on_or_off() -> None:
    assert knobs.switch("KCACHE_TEST_COMPILER_CACHE", True, {}) is True
    assert knobs.switch("KCACHE_TEST_COMPILER_CACHE", True, {"KCACHE_TEST_COMPILER_CACHE": "off"}) is False
    with pytest.raises(knobs.KnobError, match="KCACHE_TEST_COMPILER_CACHE"):
        knobs.switch("KCACHE_TEST_COMPILER_CACHE", True, {"KCACHE_TEST_COMPILER_CACHE": "maybe"})
