"""The replica's memory budget (kcache_server.memory_budget): what it admits and refuses."""

from __future__ import annotations

import contextlib
import threading

import pytest
from kcache_server.domain_errors import Overloaded
from kcache_server.memory_budget import MemoryBudget

MIB = 1 << 20


def test_takes_up_to_capacity_and_gives_everything_back() -> None:
    budget = MemoryBudget(10 * MIB)
    with budget.hold() as a, budget.hold() as b:
        a.take(6 * MIB, "a body")
        b.take(4 * MIB, "a body")
        with pytest.raises(Overloaded, match=r"a pack needs 1.0 MiB, 10.0 of 10 MiB are held by 1 other"):
            b.take(MIB, "a pack")
        assert budget.used == 10 * MIB and b.taken == 4 * MIB  # a refused take takes nothing
    assert budget.used == 0


def test_a_request_alone_always_proceeds() -> None:
    """A request bigger than the whole budget is bounded by its own size limits; it is never
    locked out, only kept from running beside others."""
    budget = MemoryBudget(10 * MIB)
    with budget.hold() as big:
        big.take(30 * MIB, "an entry body")
        with budget.hold(big) as same:  # the request's own later work joins its share
            same.take(5 * MIB, "verifying")
        with budget.hold() as other, pytest.raises(Overloaded):
            other.take(1, "a body")
    assert budget.used == 0


def test_zero_capacity_is_no_cap() -> None:
    budget = MemoryBudget(0)
    with budget.hold() as a, budget.hold() as b:
        a.take(1 << 40, "x")
        b.take(1 << 40, "y")


def test_concurrent_takes_never_overshoot() -> None:
    budget = MemoryBudget(100)
    taken: list[int] = []
    start = threading.Barrier(8)

    def worker() -> None:
        with budget.hold() as share:
            share.take(1, "x")  # nobody is alone from here on
            start.wait()
            for _ in range(50):
                with contextlib.suppress(Overloaded):
                    share.take(3, "x")
            taken.append(share.taken)
            start.wait()  # everyone holds until all have taken

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) <= 100 and budget.used == 0


def test_a_declared_size_must_fit_beside_what_is_held_and_takes_nothing() -> None:
    """Issue #31: a body's declared size is admitted against the bytes other requests hold now
    and then taken as it arrives, so a client that declares much and sends little holds little."""
    budget = MemoryBudget(10 * MIB)
    with budget.hold() as trickler, budget.hold() as other:
        trickler.admit(10 * MIB, "a request body")  # fits: nothing is held
        trickler.take(1024, "a request body")  # what arrived
        assert budget.used == 1024
        other.admit(8 * MIB, "a request body")  # the trickler's declared 10 MiB are not held
        other.take(8 * MIB, "a request body")
        with pytest.raises(Overloaded, match=r"a request body needs 4\.0 MiB"):
            trickler.admit(4 * MIB, "a request body")
        assert budget.used == 8 * MIB + 1024 and trickler.taken == 1024
    with budget.hold() as alone:
        alone.admit(30 * MIB, "a request body")  # alone, it may always proceed
    assert budget.used == 0
