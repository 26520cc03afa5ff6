"""The per-process kcache runtime: one config, one HTTP client, one uploader, one Stats.

Everything the hooks call on the compile path goes through here and is *fail-open*: kcache
errors become counted errors and a ``None``/``False`` result, never an exception into torch or
Triton. Misses and errors are counted apart.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kcache_schemas import KernelManifest, PackError, Producer, wire
from kcache_schemas import signed_envelope as envelope
from kcache_schemas.key_diff import (
    WORKLOAD_MISS,
    KeyComponents,
    components_key,
    graph_key,
    identity,
    identity_marker,
)
from kcache_schemas.signed_envelope import SignatureError
from kcache_schemas.wire import ServedBy

if TYPE_CHECKING:
    from kcache_schemas.unsound_reports import UnsoundReport

    from kcache.transport.workload import Prefetcher

from kcache.config import ClientConfig
from kcache.exceptions import Conflict, InvalidPack, KcacheError, NotFound, Quarantined
from kcache.host.after_import import imported
from kcache.host.failopen import warn_once
from kcache.host.process_roles import claim_prefetch
from kcache.store import fx_graph_envelope
from kcache.store.counters import Stats
from kcache.store.emitter import EmitOutcome, emit_files, emit_pack_manifest
from kcache.store.local_store import LocalEntryStore
from kcache.store.tiered_store import Served, TieredStore
from kcache.transport.entry_signing import EntrySigning, SigningUnavailable
from kcache.transport.http import KcacheClient
from kcache.transport.uploader import EntryUpload, KernelDirUpload, KernelUpload, Uploader
from kcache.version import __version__

log = logging.getLogger("kcache")
KERNEL_LAYER = wire.CacheLayer.KERNEL.value
# Entries that carry the compile time Inductor recorded (``time_taken_ms``).
RECORDS_COMPILE_TIME = frozenset({wire.CacheLayer.FX_GRAPH.value, wire.CacheLayer.AOT_AUTOGRAD.value})
T = TypeVar("T")
S = TypeVar("S")
CloseStep = tuple[str, Callable[[], None]]  # what it does (for its warning), and doing it


def producer_info(compile_time_s: float | None = None) -> Producer:
    torch = imported("torch")
    triton = imported("triton")
    return Producer(
        kcache_version=__version__,
        torch_version=str(getattr(torch, "__version__", "")) or None if torch else None,
        triton_version=str(getattr(triton, "__version__", "")) or None if triton else None,
        compile_time_s=compile_time_s,
    )


class Runtime:
    """One process's kcache: reached by every hook through :func:`kcache.current.get_runtime`.

    ``on_close(runtime)`` runs at the end of :meth:`close` (the exit report). :meth:`close` is
    the list :meth:`close_steps`: the layers' hand-overs (:meth:`at_close`), then the runtime's
    own steps, in order."""

    def __init__(self, config: ClientConfig, on_close: Callable[[Runtime], None] | None = None) -> None:
        self.config = config
        self._on_close = on_close
        self.stats = Stats()
        self.client: KcacheClient | None = KcacheClient(config) if config.enabled else None
        self.uploader: Uploader | None = (
            Uploader(self.client, self.stats, config.upload_queue) if self.client and config.can_write else None
        )
        # Keys this process compiled or used: for stats and workload manifests.
        self.used_kernels: set[str] = set()
        self.used_entries: set[tuple[str, str]] = set()
        # Kernels this process wrote into a Triton cache dir (key -> dir): a later compile of one
        # is a post-install finding (``emitted_then_compiled``).
        self.emitted_kernels: dict[str, Path] = {}
        self.bundle_emit_s = 0.0  # time spent emitting Inductor bundles (read_and_emit)
        # Entries torch could not load: never served again by this process, nor uploaded.
        self.quarantined: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._closed = False
        # Each layer's per-process state (what it learned serving this runtime), by its class:
        # see layer_state.
        self._layer_states: dict[type, object] = {}
        self._handovers: list[CloseStep] = []  # layers' steps, run first at close: see at_close
        self.local = LocalEntryStore.of(config)
        self.signing = EntrySigning.from_config(config)
        if self.signing is not None and self.signing.problem is not None:
            warn_once(f"entry signing is configured but unusable, so every cache entry is refused and none uploaded: {self.signing.problem}")
        self.prefetcher: Prefetcher | None = None
        if self.client is not None and config.workload and claim_prefetch():
            from kcache.transport.workload import Prefetcher

            self.prefetcher = Prefetcher(self.client, config.workload, self.local, config.prefetch_wait_s, config.prefetch_timeout_s).start()
        # Every layer's reads: local tier, a promised prefetch, the service, back-fill.
        self.tiers = TieredStore(self.local, self.prefetcher, config.prefetch_wait_s, self._may_wait_for_node)

    def layer_state(self, kind: type[S]) -> S:
        """This runtime's instance of a layer's state class ``kind`` (made, empty, at first use).

        A layer keeps what it learns while serving (keys it looked up, packages it fetched or
        handed over, timings) here and never in its module: ``uninstall()`` then ``install()``,
        or an ``install()`` with other options, starts a runtime whose layers know nothing, as
        in a fresh process."""
        with self._lock:
            state = self._layer_states.get(kind)
            if state is None:
                state = self._layer_states[kind] = kind()
            return state  # type: ignore[return-value]

    def at_close(self, name: str, step: Callable[[], None]) -> None:
        """Register a layer's ``step`` (once) to run at the start of :meth:`close`, before uploads
        are flushed: layers whose entries exist only once the job's compiles are done (Dynamo's
        precompile packages) hand them over here. ``name`` says what it does ("could not NAME at
        exit" if it raises)."""
        with self._lock:
            if all(step != known for _, known in self._handovers):
                self._handovers.append((name, step))

    def adopt_close_steps(self, previous: Runtime) -> None:
        """The layers' steps of the runtime this one replaces (another ``install()``, a forked
        child's first use): the layers stay installed, so their hand-overs run at this one's close."""
        for name, step in list(previous._handovers):
            self.at_close(name, step)

    def close_steps(self) -> list[CloseStep]:
        """What :meth:`close` does, in order."""
        with self._lock:
            handovers = list(self._handovers)
        return [
            *handovers,
            ("flush uploads", self._flush_uploads),
            ("publish the workload", self._publish_workload),
            ("close the service connection", self._close_client),
            ("check what was installed", self._post_install_checks),
            ("report stats", self._report),
        ]

    def miss_reason(self) -> str:
        hint = self.prefetcher.miss_hint if self.prefetcher is not None else None
        return hint or "not_found"

    def _unexpected(self, layer: str, exc: Exception) -> None:
        """A malformed answer (bad JSON, bad header) or a bug: an error, never into the compile."""
        self.stats.error(layer, "unexpected")
        warn_once(f"unexpected {type(exc).__name__} talking to the service", exc)

    def _remote(self, layer: str, call: Callable[[], T], key: str | None = None) -> T | None:
        """Run one service call for ``layer``: a miss, an error or a surprise is counted (apart
        from each other) and reads as None; nothing escapes into the compile. An entry ``key``
        the service answers ``quarantined`` is neither asked for again nor uploaded by this
        process (the service would refuse it)."""
        try:
            return call()
        except Quarantined:
            self.stats.miss(layer, "quarantined")
            if key is not None:
                with self._lock:
                    self.quarantined.add((layer, key))
        except NotFound:
            self.stats.miss(layer, self.miss_reason())
        except KcacheError as exc:
            self.stats.error(layer, type(exc).__name__)
        except Exception as exc:
            self._unexpected(layer, exc)
        return None

    def _may_wait_for_node(self) -> bool:
        """Whether a read may wait for another process of the node fetching the same key: not
        while the breaker is not closed (a service that failed recently is not worth waiting for,
        and callers behind a half-open probe never wait)."""
        client = self.client
        return client is not None and client.breaker.state == "closed"

    # ---- kernels --------------------------------------------------------------------------

    def note_kernel(self, key: str) -> None:
        self.compile_activity()
        with self._lock:
            self.used_kernels.add(key)

    def _kernel_pack(self, client: KcacheClient, key: str) -> Served[bytes] | None:
        """A kernel's pack from the tiered store (a workload prefetch or ``kcache warm`` put it
        in the local tier), else the service (kept in the local tier for the node's other
        processes); None on a miss or an error. Unverified: emitting it verifies it."""

        def service() -> tuple[bytes, float | None] | None:
            pack = self._remote(KERNEL_LAYER, lambda: client.get_pack(key))
            return None if pack is None else (pack, None)

        return self.tiers.read(KERNEL_LAYER, key, service, lambda pack, _tier: pack)

    def kernel_pack(self, key: str) -> bytes | None:
        """The pack kcache would emit for ``key``, not emitted (the canary compiles the kernel
        and compares): counted as a hit, with the producer's compile time as saved."""
        client = self.client
        if client is None or (KERNEL_LAYER, key) in self.quarantined:
            return None
        self.compile_activity()
        with self.stats.timed(KERNEL_LAYER):
            served = self._kernel_pack(client, key)
        if served is None:
            return None
        self.stats.hit(KERNEL_LAYER, len(served.stored), served_by=served.tier)
        self.note_kernel(key)
        return served.stored

    def fetch_kernel(self, key: str, cache_dir: Path) -> EmitOutcome | None:
        """Emit a kernel into ``cache_dir`` (the dir the asking Triton or Inductor uses) from the
        local tier (a workload prefetch or ``kcache warm`` put it there), else the service; None
        on a miss or an error."""
        client = self.client
        if client is None:
            return None
        if (KERNEL_LAYER, key) in self.quarantined:
            self.stats.miss(KERNEL_LAYER, "quarantined")
            return None
        self.compile_activity()
        with self.stats.timed(KERNEL_LAYER):
            served = self._kernel_pack(client, key)
            if served is None:
                return None
            pack = served.stored
            try:
                outcome, manifest = emit_pack_manifest(cache_dir, pack, expected_key=key, check_target=self.config.check_target)
            except (PackError, InvalidPack) as exc:
                warn_once(f"refused an invalid pack for {key}", exc)
                self.stats.error(KERNEL_LAYER, "invalid_pack")
                self.stats.verify("refused", "kernel: invalid_pack")
                return None
            except OSError as exc:
                self.stats.error(KERNEL_LAYER, "emit_failed")
                warn_once(f"could not write into {cache_dir}", exc)
                return None
            except Exception as exc:
                self._unexpected(KERNEL_LAYER, exc)
                return None
        self._count_emit(outcome, len(pack), manifest.producer.compile_time_s or 0.0, served.tier)
        self.note_kernel(key)
        self._emitted(key, cache_dir, outcome)
        return outcome

    def emit_local(self, cache_dir: Path, manifest: KernelManifest, files: Mapping[str, bytes]) -> EmitOutcome:
        """Emit files we already hold (an Inductor bundle); raises on failure for the caller's fallback."""
        outcome = emit_files(cache_dir, manifest, files, check_target=self.config.check_target, verified=True)
        self.note_kernel(manifest.key)
        self._emitted(manifest.key, cache_dir, outcome)
        return outcome

    def _emitted(self, key: str, cache_dir: Path, outcome: EmitOutcome) -> None:
        if outcome in (EmitOutcome.EMITTED, EmitOutcome.REPAIRED):
            with self._lock:
                self.emitted_kernels[key] = cache_dir

    def kernel_compiled(self, key: str, cache_dir: Path) -> None:
        """Triton compiled ``key`` in this process (its cache manager stored the group): if kcache
        had written that kernel, the install did not take (e.g. written into another dir)."""
        with self._lock:
            emitted = self.emitted_kernels.get(key)
        if emitted is not None:
            same = emitted.resolve() == cache_dir.resolve()
            self.stats.verify("emitted_then_compiled", "kernel: same dir" if same else "kernel: written into another dir")

    def _count_emit(self, outcome: EmitOutcome, nbytes: int, saved_s: float, tier: ServedBy) -> None:
        if outcome is EmitOutcome.SKIPPED_TARGET:
            self.stats.skipped(KERNEL_LAYER, "target_mismatch")
            self.stats.verify("refused", "kernel: built for another GPU")
        else:
            self.stats.hit(KERNEL_LAYER, nbytes, saved_s, tier)  # the producer's compile time, not ours

    def upload_kernel_dir(self, key: str, path: Path, now: bool = False) -> None:
        self.note_kernel(key)
        if self.uploader is not None:
            item = KernelDirUpload(key, path, producer_info())
            if now:
                self.uploader.send_now(item)
            else:
                self.uploader.submit(item)

    def upload_kernel(self, key: str, files: Mapping[str, bytes], compile_time_s: float | None = None) -> None:
        self.note_kernel(key)
        if self.uploader is not None:
            self.uploader.submit(KernelUpload(key, dict(files), producer_info(compile_time_s)))

    def missing_kernels(self, keys: Iterable[str]) -> list[str] | None:
        if self.client is None:
            return None
        try:
            return self.client.missing(keys)
        except KcacheError as exc:
            self.stats.error(KERNEL_LAYER, type(exc).__name__)
            return None
        except Exception as exc:
            self._unexpected(KERNEL_LAYER, exc)
            return None

    # ---- opaque entries -------------------------------------------------------------------

    def get_entry(self, layer: str, key: str, validate: Callable[[bytes], object] | None = None,
                  quarantine_invalid: bool = False) -> bytes | None:
        """Local tier, then a promised prefetch, then the service. With signing configured, only
        what a trusted key signed gets through (see :mod:`kcache.transport.entry_signing`), before any caller
        (Inductor's unpickler, Triton's module loader) sees a byte. ``validate(payload)`` raising
        ValueError refuses the entry the same way (counted as an error, not a hit); with
        ``quarantine_invalid``, a service copy it refuses is also quarantined (:meth:`quarantine`:
        for layers whose ``validate`` checks the content itself, so that a refusal means the
        stored bytes are damaged for every node, not that this node differs). A damaged local
        copy is only dropped: the service's may be whole."""
        if (layer, key) in self.quarantined:
            self.stats.miss(layer, "quarantined")
            return None
        self.compile_activity()
        client = self.client
        refused: SignatureError | None = None  # the local tier's copy's, said if nothing better comes
        answered = False  # the service sent a copy

        def accept(stored: bytes, tier: ServedBy) -> bytes | None:
            nonlocal refused, answered
            opened = self._open(layer, key, stored)
            if tier is not ServedBy.SERVICE:
                # A prefetched entry no trusted key signed, one kept from before the keys changed,
                # or a damaged copy: dropped, the service may hold a better one (or refuse it the same).
                if isinstance(opened, SignatureError):
                    refused = opened
                    return None
                return None if self._invalid(layer, key, opened, validate) is not None else opened
            answered = True
            if isinstance(opened, SignatureError):
                self._refused(layer, opened)
                return None
            if (why := self._invalid(layer, key, opened, validate)) is not None:
                if quarantine_invalid:
                    self.quarantine(layer, key, why, stored)
                return None
            return opened

        def service() -> tuple[bytes, float | None] | None:
            return None if client is None else self._remote(layer, lambda: client.get_entry(layer, key), key)

        with self.stats.timed(layer):
            # A service copy is kept in the local tier off the compile thread (max-autotune FX
            # entries run to hundreds of MB).
            served = self.tiers.read(layer, key, None if client is None else service, accept, backfill_in_background=True)
            if served is None:
                if not answered:
                    self._refused(layer, refused)
                return None
        data, compile_time = served.value, served.compile_time_s
        if compile_time is None and layer in RECORDS_COMPILE_TIME:
            # From the local tier or a prefetch (no service header): the time Inductor recorded
            # in the entry, so the same hit credits the same whichever tier served it.
            compile_time = fx_graph_envelope.recorded_compile_time_s(data)
        self.stats.hit(layer, len(data), compile_time or 0.0, served.tier)
        with self._lock:
            self.used_entries.add((layer, key))
        return data

    def quarantine(self, layer: str, key: str, reason: str, stored: bytes | None = None, *,
                   unprofitable: bool = False, sha256: str | None = None,
                   unsound: UnsoundReport | None = None) -> None:
        """An entry this process handed over that torch (or Triton) could not load, one that
        arrived damaged (``stored``: the bytes as the service sent them, when the local tier does
        not hold them), or (with ``unsound``) one the canary found differs from this node's own
        compile of its key: the job goes on as on a miss, or with its own compile (the caller's
        part), and here the entry is dropped from the local tier, counted (an error and a
        ``quarantined`` or ``unsound`` finding, with the reason), said once, never served or
        uploaded again by this process, and reported to the service, which then serves it to no
        node (any mode but off: a report is not an upload; a token without write scope is refused
        and counted) and keeps the unsound report. Never raises. ``sha256``: of the stored bytes
        handed over, when the caller has them.

        ``unprofitable``: torch loaded it, but it did not pay (:mod:`kcache.layers.dynamo.payoff`): the
        same, counted as an ``unprofitable`` finding rather than an error, reported with the
        reason ``does not pay: ...``."""
        with self._lock:
            self.quarantined.add((layer, key))
            self.used_entries.discard((layer, key))  # not for the workload's next prefetch
            if layer == KERNEL_LAYER:
                self.used_kernels.discard(key)
        # The report names the stored bytes that failed (the local tier holds what was handed
        # over, as stored), so the service leaves other content under the key alone: hashed
        # here, not on every hit (FX entries run to hundreds of MB).
        if sha256 is None:
            if stored is None:
                stored = self.local.get(layer, key)
            sha256 = hashlib.sha256(stored).hexdigest() if stored is not None else None
        self.local.discard(layer, key)
        if unsound is not None:
            self.stats.error(layer, "unsound")
            self.stats.verify("unsound", f"{layer}: {reason}")
            warn_once(f"kcache's canary compiled a {layer} entry's key itself and got other output ({reason[:200]}): the key is "
                      "unsound; this job uses its own compile, and the entry is quarantined for every node "
                      f"(kcache explain --key {graph_key(unsound.key)})")
        elif unprofitable:
            self.stats.verify("unprofitable", f"{layer}: {reason}")
            warn_once(f"a {layer} entry kcache supplied did not pay ({reason[:200]}); it is served to no other node")
            reason = f"does not pay: {reason}"[:512]
        else:
            self.stats.error(layer, "quarantined")
            self.stats.verify("quarantined", f"{layer}: {reason}")
            warn_once(f"a {layer} entry kcache supplied could not be used ({reason[:200]}); it compiles as on a miss, "
                      "and the entry is quarantined for every node")
        client = self.client
        if client is None:
            return
        if unsound is not None:
            try:  # first: the quarantine below may be refused (another content), the finding stands
                client.report_unsound(unsound)
            except KcacheError as exc:
                self.stats.error(layer, f"unsound_report_{type(exc).__name__}")
            except Exception as exc:
                self._unexpected(layer, exc)
        try:
            client.quarantine(layer, key, reason, sha256)
        except Conflict:
            # The service holds other content under the key (our copy was not the stored one):
            # that one stays in service; ours is gone from the local tier.
            self.stats.error(layer, "quarantine_other_content")
        except KcacheError as exc:
            self.stats.error(layer, f"quarantine_{type(exc).__name__}")
        except Exception as exc:
            self._unexpected(layer, exc)

    def _invalid(self, layer: str, key: str, data: bytes, validate: Callable[[bytes], object] | None) -> str | None:
        """Why ``validate`` refuses ``data`` (counted, said once), or None."""
        if validate is None:
            return None
        try:
            validate(data)
        except ValueError as exc:
            warn_once(f"refused a {layer} entry: {exc}")
            self.stats.error(layer, "invalid_entry")
            self.stats.verify("refused", f"{layer}: {str(exc)[:160]}")
            return f"damaged: {str(exc)[:200]}"
        return None

    def _open(self, layer: str, key: str, stored: bytes) -> bytes | SignatureError:
        """The payload of a stored entry, or why it must not be used."""
        try:
            if self.signing is not None:
                return self.signing.open(layer, key, stored)
            # Verification is not asked for here; a signed entry (producers may sign before
            # every consumer verifies) is unwrapped like any other.
            return envelope.parse(stored).payload() if envelope.is_signed(stored) else stored
        except SignatureError as exc:
            return exc

    def _refused(self, layer: str, exc: SignatureError | None) -> None:
        if exc is not None:
            if exc.reason != "unavailable":  # that one was said once, at start
                warn_once(f"refused a {layer} entry: {exc}")
            self.stats.error(layer, exc.reason)
            self.stats.verify("refused", f"{layer}: {exc.reason}")

    def with_origin(self, parts: KeyComponents) -> KeyComponents:
        """``parts`` with where they were computed: the environment fingerprint and the run id."""
        from kcache.store.fingerprint import current

        return parts.model_copy(update={"environment": current(), "run_id": self.config.run_id})

    def record_miss(self, missed: KeyComponents, now: bool = False) -> None:
        """A key that missed locally and remotely (the process compiles it next): counted for
        ``kcache explain``, and its parts stored beside it so any node can explain its misses
        (``now``: sent in this thread, as in compile workers killed without exit handlers),
        with a marker under the key's identity (the parts that name the computation) so a job
        without a workload finds its nearest stored key too."""
        self.stats.missed(missed.layer, missed.key, self.miss_reason())
        if missed.components:
            missed = self.with_origin(missed)
            data = missed.model_dump_json().encode()
            layer = wire.CacheLayer.KEY_COMPONENTS.value
            self.put_entry(layer, components_key(missed.layer, missed.key), data, record=False, now=now)
            ident = identity(missed)
            if ident is not None:
                marker = identity_marker(missed.layer, ident, missed.key)
                self.put_entry(layer, marker, components_key(missed.layer, missed.key).encode(), record=False, now=now)

    def put_entry(self, layer: str, key: str, data: bytes | Callable[[], bytes], compile_time_s: float | None = None,
                  now: bool = False, record: bool = True) -> None:
        """Queue an upload (``now``: send it in this thread, for processes killed without exit
        handlers). ``data``: the payload, or how to make it (called once, in the uploader
        thread: what a layer stores in its own form is encoded off the compile path). Signed
        there too, if signing is configured; a process that only verifies
        (``KCACHE_TRUSTED_KEYS`` without a private key) uploads no entries. ``record``: list it in
        the workload's manifest (what the next job prefetches)."""
        self.compile_activity()
        if (layer, key) in self.quarantined:
            return  # the service refuses it, and it would not load anywhere else either
        if record:
            with self._lock:
                self.used_entries.add((layer, key))
        if self.uploader is None:
            return
        if self.signing is not None and self.signing.signer is None and self.signing.problem is None:
            return
        item = EntryUpload(layer, key, functools.partial(self._stored_form, layer, key, data), compile_time_s)
        if now:
            self.uploader.send_now(item)
        else:
            self.uploader.submit(item)

    def _stored_form(self, layer: str, key: str, data: bytes | Callable[[], bytes]) -> bytes | None:
        """What is uploaded for an entry: the payload, signed if signing is configured; None
        (counted) when it cannot be signed."""
        payload = data() if callable(data) else data
        if self.signing is None:
            return payload
        try:
            return self.signing.seal(layer, key, payload)
        except SigningUnavailable:
            self.stats.put_error(layer, "signing_unavailable")
        except Exception as exc:  # a bug of ours: this entry stays local
            self.stats.put_error(layer, "signing_failed")
            warn_once(f"could not sign a {layer} entry", exc)
        return None

    def compile_activity(self) -> None:
        """A hook ran on the compile path: background uploads wait for a quiet moment
        (:mod:`kcache.transport.uploader`)."""
        if self.uploader is not None:
            self.uploader.compile_activity()

    # ---- lifecycle ------------------------------------------------------------------------

    def _post_install_checks(self) -> None:
        """At exit: a workload found only under other environments is a miss to explain, and
        what its prefetch brought that no compile of this process asked for is counted (a job
        that compiles less than its workload, or keys that drifted)."""
        prefetcher = self.prefetcher
        if prefetcher is None or not prefetcher.done.is_set():
            return
        if prefetcher.miss_hint:
            self.stats.missed(WORKLOAD_MISS, prefetcher.name, "other_environment")
        view = prefetcher.view
        if view is None or not view.runs:
            return
        with self._lock:
            unused_kernels = len(set(view.kernels) - self.used_kernels)
            unused = [e.layer for e in view.entries if (e.layer, e.key) not in self.used_entries]
        for layer in [KERNEL_LAYER] * unused_kernels + unused:
            self.stats.verify("fetched_unused", f"{layer}: prefetched, never asked for")

    def service_known_dead(self) -> bool:
        """True when waiting for the service cannot help: it refused our last connection or the
        breaker is open. A service merely not contacted yet is not dead."""
        return self.client is None or self.client.known_dead()

    def close(self) -> None:
        """Run :meth:`close_steps` once, each fail-open: one that raises is one warning, and the
        next still runs."""
        if self._closed:
            return
        self._closed = True
        for name, step in self.close_steps():
            try:
                step()
            except Exception as exc:
                warn_once(f"could not {name} at exit", exc)

    def _flush_uploads(self) -> None:
        # A job that exits right after compiling still hands its uploads to a healthy service,
        # whether or not the service answered this process before; a service known to be dead
        # (refused, or the breaker open) costs nothing, and any other wait is capped.
        if self.uploader is not None and not self.uploader.flush(self.config.flush_timeout_s, give_up=self.service_known_dead):
            dropped = self.uploader.drop_pending()  # counted per layer as dropped_at_exit
            if dropped:
                why = "the service is unreachable" if self.service_known_dead() else f"still pending after {self.config.flush_timeout_s:g}s"
                warn_once(f"{dropped} uploads dropped at exit: {why}")

    def _publish_workload(self) -> None:
        if self.client is not None and self.config.workload and self.config.can_write and (self.used_kernels or self.used_entries):
            from kcache.transport.workload import publish

            try:
                publish(self.client, self.config.workload, self.used_kernels, self.used_entries)
            except KcacheError as exc:
                self.stats.put_error("workload", type(exc).__name__)

    def _close_client(self) -> None:
        if self.client is not None and (self.uploader is None or self.uploader.idle()):
            # Otherwise leave it open: the uploader thread may still be finishing a request,
            # which then fails or succeeds on its own and is counted either way.
            self.client.close()

    def _report(self) -> None:
        if self._on_close is not None:  # stats file, summary line, run stats: see kcache.current
            self._on_close(self)
