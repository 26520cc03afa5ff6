"""Garbage collection: each namespace kept within its retention rules, next to live reads and
writes and other replicas of the service.

Scan → plan → execute (huggingface_hub's cache-pruning habit):

* **scan** the namespace's kernels and entries with their last use (last access, or creation if
  never read), its published workload runs (which environment used which keys) and its pins;
* **plan** evictions, each under the first reason that applies:

  1. ``env``: built for an environment nobody used for ``env_idle`` (or the one ``env`` names);
  2. ``ttl``: not used for ``ttl`` (or ``older_than``);
  3. ``budget``: least recently used first, until the namespace holds at most its soft limit
     (or ``max_bytes``);

  never anything a pinned workload lists, never anything used within ``min_age``;
* **execute** through the store's delete protocol (:meth:`.BlobReferences.evict`): each record only
  if it was not used since the scan, index entry first, its blob after, once no record of any
  namespace references it.

One GC at a time across replicas: a lease in the index, renewed while it runs. The orphan sweep
(blobs no record references, e.g. after a crash mid-write) is a rarer pass over the whole blob
store (``orphan_interval``, or ``orphans`` in a request).

**Environments.** A workload run's manifest names the full environment (torch, triton,
CUDA/HIP, GPU arch) of the job that used its kernels and entries; that is where an item's
environment comes from. An item listed by runs of several environments belongs to all of them
and is purged only when every one of them matches. An item no run lists knows less: a kernel its
Triton version and GPU arch (from its manifest), an entry the producer's torch/Triton versions
if its client sent them; it matches an environment only on fields it knows, and only if it knows
every field asked for. So a fingerprint id (which names torch) purges only what workload runs
attributed to it, while ``triton=3.5.1`` also reaches kernels no workload listed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kcache_schemas.gc_models import (
    ENV_FIELDS,
    REASON_BUDGET,
    REASON_ENV,
    REASON_TTL,
    Amount,
    GcItem,
    GcReport,
    GcRequest,
    GcStatus,
    RetentionPolicy,
)
from kcache_schemas.models import EnvFingerprint, WorkloadManifest
from kcache_schemas.units import format_bytes, format_duration
from pydantic import ValidationError

from kcache_server.domain_errors import GcBusy, InvalidRequest, NotFound
from kcache_server.kinds import GC, KERNEL, WORKLOAD, entry_kind, is_cache_kind, workload_name
from kcache_server.retention_rules import RetentionConfig, policy_active
from kcache_server.storage import BackendUnavailable, BlobStore, IndexRecord, StorageError
from kcache_server.storage.base import BlobInfo, Index, blob_ref, new_token, token_time
from kcache_server.store.access_recorder import AccessRecorder
from kcache_server.store.blob_references import BlobReferences
from kcache_server.store.pins import Pins
from kcache_server.store.records import Records

log = logging.getLogger("kcache_server.gc")  # the name operators filter on (the module moved)

LEASE = "gc"
ORPHAN_LEASE = "gc-orphans"  # taken for orphan_interval and never released: one sweep per interval
LEASE_TTL_S = 60.0
_EVICT_BATCH = 500
_REPORT_ITEMS = 100
# A writer's claim younger than this is a write in flight (they take seconds), whatever min age
# a sweep is asked for: the sweep releases only claims of writers that died.
CLAIM_GRACE_S = 300.0
_MIN_GAP_S = 1.0
_STATUS_KEY = "last"
_FINGERPRINT_ID = re.compile(r"^[0-9a-f]{16}$")

ItemId = tuple[str, str]  # (kind, key)


# ---- environments ---------------------------------------------------------------------------------


def _norm(name: str, value: str) -> str:
    v = value.strip().lower()
    return v[3:] if name == "gpu_arch" and v.startswith("sm_") else v  # sm_90 and a kernel's 90


def fingerprint_fields(fp: EnvFingerprint) -> dict[str, str]:
    return {k: _norm(k, v) for k, v in fp.model_dump().items() if k in ENV_FIELDS and v}


def env_selector(text: str, known: dict[str, EnvFingerprint]) -> dict[str, str]:
    """``<fingerprint id>`` (of a run in this namespace) or ``field=value[,field=value]``."""
    text = text.strip()
    if _FINGERPRINT_ID.match(text):
        fp = known.get(text)
        if fp is None:
            raise NotFound(f"no workload run in this namespace has environment {text}; `kcache ls --workloads` lists them")
        fields = fingerprint_fields(fp)
        if not fields:
            raise InvalidRequest(f"environment {text} names nothing (no torch, triton, CUDA or arch): it matches everything")
        return fields
    selector: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        name = "gpu_arch" if name == "arch" else name
        if not sep or name not in ENV_FIELDS or not value.strip():
            raise InvalidRequest(
                f"env {text[:80]!r}: give an environment id (16 hex, `kcache ls --workloads`) or "
                f"field=value pairs of {', '.join(ENV_FIELDS)} separated by commas"
            )
        selector[name] = _norm(name, value)
    return selector


def own_environment(record: IndexRecord) -> dict[str, str]:
    """What a record itself says about the environment that built it."""
    try:
        meta = json.loads(record.meta)
    except ValueError:
        return {}
    found: dict[str, str | None] = {}
    if record.kind == KERNEL:
        found = {"triton": meta.get("triton_version"), "gpu_arch": (meta.get("target") or {}).get("arch")}
    else:
        producer = meta.get("producer") or {}
        found = {"torch": producer.get("torch_version"), "triton": producer.get("triton_version")}
    return {k: _norm(k, str(v)) for k, v in found.items() if v}


def _matches(selector: dict[str, str], env: dict[str, str]) -> bool:
    return bool(selector) and all(env.get(k) == v for k, v in selector.items())


# ---- scan and plan ------------------------------------------------------------------------------------


@dataclass
class _Scan:
    records: list[IndexRecord]  # kernels and entries, meta dropped
    own_env: dict[ItemId, dict[str, str]]
    runs: list[tuple[IndexRecord, WorkloadManifest]]
    pins: list[str]
    pinned: set[ItemId]
    item_fps: dict[ItemId, set[str]]
    fingerprints: dict[str, EnvFingerprint]


@dataclass
class Plan:
    report: GcReport
    evictions: list[tuple[IndexRecord, str]]
    orphans: list[BlobInfo] = field(default_factory=list)
    stale_claims: dict[str, dict[str, str]] = field(default_factory=dict)  # orphan digest -> {ref: token}
    refs: list[tuple[str, str]] = field(default_factory=list)  # every record's (digest, ref), for the backfill


class _Lease:
    def __init__(self, index: Index, name: str, ttl_s: float) -> None:
        self.index, self.name, self.ttl_s = index, name, ttl_s
        self.token = new_token()
        self._at = 0.0

    def acquire(self) -> bool:
        ok = self.index.acquire_lease(self.name, self.token, self.ttl_s)
        if ok:
            self._at = time.monotonic()
        return ok

    def keep(self) -> bool:
        """Renew if a third of the lease has passed; False if another holder took it meanwhile."""
        return time.monotonic() - self._at < self.ttl_s / 3 or self.acquire()

    def release(self) -> None:
        with contextlib.suppress(StorageError):
            self.index.release_lease(self.name, self.token)


class Collector:
    """Plans and runs GCs over one store with its retention rules (``rules()``: the rules now,
    asked per use, so rules set after the store is built apply)."""

    def __init__(
        self, blobs: BlobStore, index: Index, access: AccessRecorder, records: Records, references: BlobReferences,
        pins: Pins, rules: Callable[[], RetentionConfig],
    ) -> None:
        self._blobs, self._index, self._access, self._records = blobs, index, access, records
        self._references, self._pins, self._rules = references, pins, rules
        # Called with every finished (not dry) run: metrics.
        self.observers: list[Callable[[GcReport], None]] = []
        # Set at shutdown: a running pass stops between batches (what it did so far stands).
        self.stopping = threading.Event()

    @property
    def config(self) -> RetentionConfig:
        return self._rules()

    # ---- entry points -----------------------------------------------------------------------

    def run(self, namespace: str, request: GcRequest, trigger: str = "api", now: float | None = None) -> GcReport:
        """Plan and (unless a dry run) execute one GC of ``namespace`` under the lease."""
        lease = _Lease(self._index, LEASE, LEASE_TTL_S)
        if not lease.acquire():
            raise GcBusy("another GC is running (on this or another replica); retry when it has finished")
        try:
            return self._run_leased(namespace, request, trigger, lease, now)
        finally:
            lease.release()

    def run_policies(self, trigger: str = "schedule") -> list[GcReport]:
        """The background pass: every namespace with a rule, then the orphan sweep when due.
        Returns nothing when another replica's GC holds the lease."""
        lease = _Lease(self._index, LEASE, LEASE_TTL_S)
        if not lease.acquire():
            return []
        reports = []
        try:
            for namespace in sorted(self._records.namespaces()):
                if self.stopping.is_set():
                    break
                if policy_active(self.config.policy(namespace)):
                    reports.append(self._run_leased(namespace, GcRequest(), trigger, lease, None))
                if not lease.keep():
                    break
            interval = self.config.orphan_interval
            if interval and not self.stopping.is_set() and lease.keep() and self._index.acquire_lease(ORPHAN_LEASE, new_token(), interval):
                reports.append(self._sweep_orphans(trigger, lease))
        finally:
            lease.release()
        return reports

    def last_report(self, namespace: str) -> GcReport | None:
        """The namespace's last executed GC run (any replica's), without its item list."""
        record = self._index.get(namespace, GC, _STATUS_KEY)
        if record is None:
            return None
        try:
            return GcReport.model_validate_json(record.meta)
        except ValidationError:
            return None

    def status(self, namespace: str) -> GcStatus:
        return GcStatus(
            namespace=namespace, policy=self.config.policy(namespace), usage=self._records.cache_usage(namespace),
            pins=[p.workload for p in self._pins.listing(namespace).items], last_run=self.last_report(namespace),
        )

    # ---- the run ----------------------------------------------------------------------------

    def _run_leased(self, namespace: str, request: GcRequest, trigger: str, lease: _Lease, now: float | None) -> GcReport:
        t0 = time.monotonic()
        self._access.flush()  # this process's pending hits count before we judge recency
        plan = self.plan(namespace, request, trigger=trigger, now=now)
        report = plan.report if request.dry_run else self._execute(plan, lease)
        report = report.model_copy(update={"seconds": round(time.monotonic() - t0, 3)})
        if not request.dry_run:
            self._save_status(report)
            for observe in self.observers:
                with contextlib.suppress(Exception):
                    observe(report)
        return report

    def plan(self, namespace: str, request: GcRequest, *, trigger: str = "api", now: float | None = None) -> Plan:
        now = time.time() if now is None else now
        policy = self._effective(namespace, request)
        scan = self._scan(namespace, need_envs=bool(request.env or policy.env_idle_s))
        recent = now - policy.min_age_s
        chosen: dict[ItemId, tuple[IndexRecord, str]] = {}
        runs_out: list[tuple[IndexRecord, str]] = []
        notes: list[str] = []

        def eligible(r: IndexRecord, idle_since: float) -> bool:
            return (r.kind, r.key) not in scan.pinned and r.last_used <= min(recent, idle_since)

        fields_of = {fp_id: fingerprint_fields(fp) for fp_id, fp in scan.fingerprints.items()}

        def item_matches(selector: dict[str, str], r: IndexRecord) -> bool:
            fps = scan.item_fps.get((r.kind, r.key))
            if fps:
                return all(_matches(selector, fields_of[f]) for f in fps)
            return _matches(selector, scan.own_env.get((r.kind, r.key), {}))

        def purge(selector: dict[str, str], idle_since: float) -> None:
            for r in scan.records:
                if (r.kind, r.key) not in chosen and eligible(r, idle_since) and item_matches(selector, r):
                    chosen[(r.kind, r.key)] = (r, REASON_ENV)
            for run, manifest in scan.runs:
                name = workload_name(run.kind)
                if name not in scan.pins and run.last_used <= idle_since and _matches(selector, fingerprint_fields(manifest.fingerprint)):
                    runs_out.append((run, REASON_ENV))

        env_applied: dict[str, str] | None = None
        if request.env:
            env_applied = env_selector(request.env, scan.fingerprints)
            purge(env_applied, now - (request.older_than_s or 0))
        elif policy.env_idle_s is not None:
            for fp_id, fp in sorted(scan.fingerprints.items()):
                fields = fingerprint_fields(fp)
                if fields and now - self._env_last_use(fp_id, scan) >= policy.env_idle_s:
                    notes.append(f"environment {fp_id} ({fp.describe()}) unused for over {format_duration(policy.env_idle_s)}: purged")
                    purge(fields, now)
        if policy.ttl_s is not None:
            for r in scan.records:
                if (r.kind, r.key) not in chosen and eligible(r, now - policy.ttl_s):
                    chosen[(r.kind, r.key)] = (r, REASON_TTL)
        total = sum(r.size for r in scan.records)
        left = total - sum(r.size for r, _ in chosen.values())
        target = request.max_bytes if request.max_bytes is not None else policy.soft_limit_bytes
        if target is not None and left > target:
            for r in sorted(scan.records, key=lambda r: (r.last_used, r.kind, r.key)):
                if left <= target:
                    break
                if (r.kind, r.key) not in chosen and eligible(r, now):
                    chosen[(r.kind, r.key)] = (r, REASON_BUDGET)
                    left -= r.size

        remaining = [r for r in scan.records if (r.kind, r.key) not in chosen]
        kept_recent, kept_pinned = Amount(), Amount()
        for r in remaining:
            if (r.kind, r.key) in scan.pinned:
                kept_pinned = kept_pinned.plus(r.size)
            elif r.last_used > recent:
                kept_recent = kept_recent.plus(r.size)
        if target is not None and left > target:
            notes.append(
                f"still {format_bytes(left - target)} over the budget of {format_bytes(target)}: "
                f"{format_bytes(kept_recent.bytes)} was used within the last {format_duration(policy.min_age_s)} "
                f"(min age) and {format_bytes(kept_pinned.bytes)} is pinned"
            )
        evictions = sorted(chosen.values(), key=lambda e: (e[0].last_used, e[0].kind, e[0].key))
        planned: dict[str, Amount] = {}
        for r, reason in evictions:
            planned[reason] = planned.get(reason, Amount()).plus(r.size)
        if runs_out:
            notes.append(f"{len(runs_out)} workload run(s) of the purged environment are removed too")
        items = [GcItem(kind=r.kind, key=r.key, size=r.size, last_used=r.last_used, reason=reason) for r, reason in evictions[:_REPORT_ITEMS]]
        report = GcReport(
            namespace=namespace, trigger=trigger, dry_run=request.dry_run, policy=policy, target_bytes=target,
            env=env_applied, started_at=now, before=Amount(entries=len(scan.records), bytes=total),
            after=Amount(entries=len(remaining), bytes=left), planned=planned, kept_recent=kept_recent,
            kept_pinned=kept_pinned, pins=scan.pins, oldest_used=min((r.last_used for r in remaining), default=None),
            items=items, more_items=max(0, len(evictions) - len(items)), notes=notes,
        )
        plan = Plan(report, evictions + runs_out)
        if request.orphans:
            min_age = request.min_age_s if request.min_age_s is not None else self.config.orphan_min_age
            plan.orphans, plan.stale_claims, plan.refs = self._find_orphans(now, min_age)
            plan.report = report.model_copy(update={"orphans": Amount(entries=len(plan.orphans), bytes=sum(b.size for b in plan.orphans))})
        return plan

    def _effective(self, namespace: str, request: GcRequest) -> RetentionPolicy:
        policy = self.config.policy(namespace)
        update: dict[str, float | None] = {}
        if request.min_age_s is not None:
            update["min_age_s"] = request.min_age_s
        if request.older_than_s is not None and not request.env:
            update["ttl_s"] = request.older_than_s
        return policy.model_copy(update=update)

    def _env_last_use(self, fp_id: str, scan: _Scan) -> float:
        """The last time anything showed environment ``fp_id`` is in use: a run published (or
        re-published) with it, or a read of an item only it lists."""
        last = max((run.last_used for run, m in scan.runs if m.fingerprint.id == fp_id), default=0.0)
        for r in scan.records:
            if scan.item_fps.get((r.kind, r.key)) == {fp_id}:
                last = max(last, r.last_used)
        return last

    def _scan(self, namespace: str, need_envs: bool) -> _Scan:
        kinds = sorted(self._records.kinds(namespace))
        records: list[IndexRecord] = []
        own_env: dict[ItemId, dict[str, str]] = {}
        for kind in kinds:
            if not is_cache_kind(kind):
                continue
            # Without their JSON unless an environment purge needs what kernels say of theirs.
            for r in self._records.iter_records(namespace, kind, meta=need_envs):
                if need_envs:
                    own_env[(r.kind, r.key)] = own_environment(r)
                    r = dataclasses.replace(r, meta="")  # 100k records: keep memory small
                records.append(r)
        runs: list[tuple[IndexRecord, WorkloadManifest]] = []
        for kind in kinds:
            if kind.split("/", 1)[0] == WORKLOAD:
                for r in self._records.iter_records(namespace, kind):
                    with contextlib.suppress(ValidationError):
                        runs.append((dataclasses.replace(r, meta=""), WorkloadManifest.model_validate_json(r.meta)))
        pins = [p.workload for p in self._pins.listing(namespace).items]
        pinned: set[ItemId] = set()
        item_fps: dict[ItemId, set[str]] = {}
        fingerprints: dict[str, EnvFingerprint] = {}
        for run, m in runs:
            ids: list[ItemId] = [(KERNEL, k) for k in m.kernels] + [(entry_kind(e.layer), e.key) for e in m.entries]
            if workload_name(run.kind) in pins:
                pinned.update(ids)
            if need_envs:
                fingerprints[m.fingerprint.id] = m.fingerprint
                for item in ids:
                    item_fps.setdefault(item, set()).add(m.fingerprint.id)
        return _Scan(records, own_env, runs, pins, pinned, item_fps, fingerprints)

    # ---- execution --------------------------------------------------------------------------

    def _execute(self, plan: Plan, lease: _Lease) -> GcReport:
        notes = list(plan.report.notes)
        if not self._references.refs_complete():
            added = self._references.backfill()
            notes.append(f"backfilled {added} blob references (records written before retention existed)")
        evicted: dict[str, Amount] = {}
        skipped, shared = 0, 0
        blobs_deleted = Amount()
        for i in range(0, len(plan.evictions), _EVICT_BATCH):
            if self.stopping.is_set():
                notes.append("stopped: the service is shutting down")
                break
            if not lease.keep():
                notes.append("stopped: the GC lease was lost (another replica took over)")
                break
            batch = plan.evictions[i : i + _EVICT_BATCH]
            result = self._references.evict([r for r, _ in batch])
            for (r, reason), ok in zip(batch, result.deleted, strict=True):
                if not ok:
                    skipped += 1
                elif is_cache_kind(r.kind):
                    evicted[reason] = evicted.get(reason, Amount()).plus(r.size)
            blobs_deleted = blobs_deleted.plus(result.blobs_deleted.bytes, result.blobs_deleted.entries)
            shared += result.blobs_shared
        orphans = self._delete_orphans(plan, lease, notes) if plan.report.orphans.entries or plan.refs else Amount()
        after = self._records.cache_usage(plan.report.namespace)
        return plan.report.model_copy(update={
            "evicted": evicted, "skipped": skipped, "blobs_deleted": blobs_deleted, "blobs_shared": shared,
            "orphans": orphans, "after": after, "notes": notes,
        })

    def _save_status(self, report: GcReport) -> None:
        if report.namespace == "*":
            return
        summary = report.model_copy(update={"items": [], "more_items": len(report.items) + report.more_items}).model_dump_json()
        try:
            self._index.upsert(IndexRecord(namespace=report.namespace, kind=GC, key=_STATUS_KEY, digest="", size=len(summary), meta=summary))
        except BackendUnavailable as exc:
            log.warning("could not record the GC report of %s: %s", report.namespace, exc)

    # ---- orphans ----------------------------------------------------------------------------

    def _iter_all_records(self) -> Iterator[IndexRecord]:
        for namespace, kinds in self._index.usage().items():
            for kind in kinds:
                yield from self._records.iter_records(namespace, kind, meta=False)

    def _find_orphans(self, now: float, min_age: float) -> tuple[list[BlobInfo], dict[str, dict[str, str]], list[tuple[str, str]]]:
        """Blobs older than ``min_age`` that no record names and no live writer claims; and every
        record's reference, so the execution can backfill any that is missing."""
        referenced: set[str] = set()
        refs: list[tuple[str, str]] = []
        for r in self._iter_all_records():
            if r.digest:
                referenced.add(r.digest)
                refs.append((r.digest, blob_ref(r.namespace, r.kind, r.key)))
        cutoff = now - min_age
        candidates = [b for b in self._blobs.scan() if b.digest not in referenced and b.modified <= cutoff]
        claims = self._index.blob_refs([b.digest for b in candidates]) if candidates else {}
        orphans: list[BlobInfo] = []
        stale: dict[str, dict[str, str]] = {}
        claim_cutoff = now - max(min_age, CLAIM_GRACE_S)
        for blob in candidates:
            held = claims.get(blob.digest, {})
            if any(token_time(t) > claim_cutoff for t in held.values()):
                continue  # a writer claimed it recently: its record is about to commit
            if any(self._names(ref, blob.digest) for ref in held):
                continue  # committed since our scan
            orphans.append(blob)
            if held:
                stale[blob.digest] = held  # claims of writers that died before their insert
        return orphans, stale, refs

    def _names(self, ref: str, digest: str) -> bool:
        namespace, kind, key = json.loads(ref)
        record = self._index.get(namespace, kind, key)
        return record is not None and record.digest == digest

    def _delete_orphans(self, plan: Plan, lease: _Lease, notes: list[str]) -> Amount:
        if plan.refs:
            added = self._index.backfill_blob_refs(plan.refs)
            self._index.set_blob_refs_complete()
            if added:
                notes.append(f"added {added} missing blob references")
        deleted = Amount()
        for i in range(0, len(plan.orphans), _EVICT_BATCH):
            if not lease.keep():
                notes.append("stopped: the GC lease was lost (another replica took over)")
                break
            batch = plan.orphans[i : i + _EVICT_BATCH]
            self._index.release_blobs([(b.digest, ref, token) for b in batch for ref, token in plan.stale_claims.get(b.digest, {}).items()])
            gone = set(self._references.delete_blobs_if_unreferenced([b.digest for b in batch]))
            for blob in batch:
                if blob.digest in gone:
                    deleted = deleted.plus(blob.size)
        partial = self._blobs.remove_partial(plan.report.started_at - self.config.orphan_min_age)
        if partial:
            notes.append(f"removed {partial} partial writes")
        return deleted

    def _sweep_orphans(self, trigger: str, lease: _Lease) -> GcReport:
        t0, now = time.monotonic(), time.time()
        orphans, stale, refs = self._find_orphans(now, self.config.orphan_min_age)
        report = GcReport(namespace="*", trigger=trigger, dry_run=False, policy=RetentionPolicy(), started_at=now,
                          before=Amount(), after=Amount(), orphans=Amount(entries=len(orphans), bytes=sum(b.size for b in orphans)))
        plan = Plan(report, [], orphans, stale, refs)
        notes: list[str] = []
        deleted = self._delete_orphans(plan, lease, notes)
        report = report.model_copy(update={"orphans": deleted, "notes": notes, "seconds": round(time.monotonic() - t0, 3)})
        if deleted.entries:
            log.info("orphan sweep deleted %d blobs (%s)", deleted.entries, format_bytes(deleted.bytes))
        for observe in self.observers:
            with contextlib.suppress(Exception):
                observe(report)
        return report


class GcScheduler:
    """The background GC of one service process: every ``gc_interval``, or at once when an upload
    met a namespace's limit. Several processes and replicas each run one; the lease lets one
    of them work at a time."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.interval_s = collector.config.gc_interval
        self.last: list[GcReport] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kcache-gc", daemon=True)

    def start(self) -> GcScheduler:
        self._thread.start()
        return self

    def wake(self, namespace: str = "") -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.last = self.collector.run_policies("pressure" if woken else "schedule")
            except BackendUnavailable as exc:
                log.warning("GC skipped: %s", exc)
            except Exception:
                log.exception("GC failed")
            # Uploads that keep meeting a limit wake us again at once: one pass per gap at most.
            self._stop.wait(min(self.interval_s, _MIN_GAP_S))

    def close(self) -> None:
        self._stop.set()
        self.collector.stopping.set()
        self._wake.set()
        self._thread.join(timeout=30)
