"""The ``kcache`` command line.

Exit codes (README, "CLI"): 0 done; 1 the command failed (the service refused or could not be
reached, a path, workload or key that does not exist, kernels refused); 2 a wrong argument or
setting (argparse's usage errors, a value that does not parse, ``KCACHE_*`` included), and for
``kcache stats --fail-under`` a hit rate under the bar (coverage.py's habit); 130 interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kcache.config import ClientConfig
from kcache.exceptions import ConfigError, KcacheError, NotFound, Quarantined, ServiceUnavailable
from kcache.version import __version__

if TYPE_CHECKING:
    from kcache_schemas.gc_models import GcReport
    from kcache_schemas.models import EntryInfo, QuarantineInfo
    from kcache_schemas.purge import PurgeReport

    from kcache.transport.http import KcacheClient

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
T = TypeVar("T")


def _flag(name: str) -> str:
    """How the CLI spells a setting it was given (for errors): ``--namespace``."""
    return "--" + name.replace("_", "-")


def _client(args: argparse.Namespace, read_timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    from kcache.transport.http import KcacheClient

    config = ClientConfig.from_env(given_as=_flag, url=args.url, token=args.token, namespace=args.namespace)
    if not config.url:
        raise ConfigError("no service URL: pass --url or set KCACHE_URL (e.g. http://127.0.0.1:8765)")
    # The CLI is interactive, not on a compile path: allow slower answers than the hooks do.
    return KcacheClient(ClientConfig(**{**config.__dict__, "read_timeout_s": max(config.read_timeout_s, read_timeout_s), "connect_timeout_s": max(config.connect_timeout_s, 5.0)}))


def plural(n: int, noun: str) -> str:
    """``1 kernel``, ``3 kernels``, ``2 processes``."""
    if n == 1:
        return f"{n} {noun}"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return f"{n} {noun[:-1]}ies"
    return f"{n} {noun}es" if noun.endswith(("s", "sh", "ch", "x")) else f"{n} {noun}s"


def _size_text(n: int | float) -> str:
    from kcache_schemas.units import format_bytes

    return format_bytes(n)


def _size(raw: str) -> int:
    """An argument in kcache_schemas.units' byte grammar (``40GB``, ``500MiB``, bytes)."""
    from kcache_schemas.units import parse_bytes

    try:
        return parse_bytes(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _age(raw: str) -> float:
    """A duration with its unit (``7d``, ``1h``): a bare number is refused (``--older-than 7`` was
    read as seconds), except ``0``."""
    from kcache_schemas.units import parse_duration

    try:
        return parse_duration(raw, bare_seconds=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def hit_rate_bar(raw: str) -> float:
    """``--fail-under``, as a percentage: ``80%`` and ``80`` are 80 %, and so is the fraction
    ``0.8`` (a bare number below 1 is a fraction; below 1 % write ``0.5%``). 0-100 %."""
    text = raw.strip()
    try:
        value = float(text.removesuffix("%").strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a hit rate: use 80%, 80 or 0.8 (all mean 80 %)") from None
    percent = value if text.endswith("%") or value >= 1 else value * 100
    if not 0 <= percent <= 100:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a hit rate: it must be within 0-100 % (80%, 80 or 0.8)")
    return percent


SERVE_ENTRY_POINTS = "kcache.serve"
# Not on PyPI yet, and PyPI's `kcache` is an unrelated project: a hint names a checkout, never the registry.
SERVER_INSTALL_HINT = "install kcache-server from a kcache checkout: pip install <checkout> (not on PyPI yet; PyPI's 'kcache' is another project)"


def _serve(args: argparse.Namespace) -> int:
    """Run the service found through the ``kcache.serve`` entry point (the ``kcache-server``
    distribution declares it; the client-only ``kcache-client`` does not): the client never
    imports it."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=SERVE_ENTRY_POINTS))
    try:
        serve = found[0].load() if found else None
    except ImportError as exc:
        print(f"kcache serve: the service is installed but {exc.name} is missing: pip install {exc.name}, or {SERVER_INSTALL_HINT}", file=sys.stderr)
        return 2
    if serve is None:
        print(f"kcache serve needs the service, which this install lacks (kcache-client is the client alone): {SERVER_INSTALL_HINT}", file=sys.stderr)
        return 2
    serve({"host": args.host, "port": args.port, "data_dir": args.data_dir, "workers": args.workers, "log_level": args.log_level})
    return EXIT_OK


def kernel_dirs(cache_dir: Path) -> list[Path]:
    """Complete-looking kernel dirs: a key-named dir holding a Triton group file."""
    from kcache_schemas import InvalidKeyError, normalize_kernel_key

    out = []
    for d in sorted(cache_dir.iterdir()) if cache_dir.is_dir() else []:
        try:
            normalize_kernel_key(d.name)
        except InvalidKeyError:
            continue
        if d.is_dir() and any(p.name.startswith("__grp__") for p in d.iterdir()):
            out.append(d)
    return out


def _push(args: argparse.Namespace) -> int:
    from kcache_schemas import PackError
    from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir

    from kcache.cli.progress import Progress
    from kcache.runtime import producer_info
    from kcache.store.kernel_dirs import triton_cache_dir

    cache_dir = Path(args.dir) if args.dir else triton_cache_dir()
    if not cache_dir.is_dir():
        given = "" if args.dir else " (the default Triton cache dir: $TRITON_CACHE_DIR or ~/.triton/cache; pass DIR)"
        print(f"kcache push: {cache_dir}: no such directory{given}", file=sys.stderr)
        return EXIT_FAILED
    client = _client(args)
    dirs = kernel_dirs(cache_dir)
    if not dirs:
        print(f"kcache push: no kernel dirs in {cache_dir} (a kernel dir is named by Triton's 52-char key "
              "and holds a __grp__*.json); nothing to push", file=sys.stderr)
        return EXIT_OK
    missing = set(client.missing([d.name for d in dirs]))
    todo = [d for d in dirs if d.name in missing]
    progress = Progress("push", len(todo))
    skipped: list[str] = []

    def upload(d: Path) -> int:
        try:
            files = read_kernel_dir(d)
            manifest = manifest_for_files(d.name, files, producer_info())
        except PackError as exc:
            skipped.append(f"{d.name}: {exc}")
            return 0
        pack = build_pack(manifest, files)
        client.put_pack(d.name, pack)
        return len(pack)

    with ThreadPoolExecutor(max_workers=8) as pool:
        for nbytes in pool.map(upload, todo):
            progress.advance(nbytes)
    progress.close()
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    print(
        f"pushed {plural(len(todo) - len(skipped), 'kernel')} ({_size_text(progress.nbytes)}) in {progress.seconds:.2f}s; "
        f"{len(dirs) - len(todo)} already present, {len(skipped)} skipped; from {cache_dir}"
    )
    return EXIT_OK


def _pull(args: argparse.Namespace) -> int:
    from kcache_schemas import PackError

    from kcache.cli.progress import Progress
    from kcache.store.emitter import EmitOutcome, emit_pack
    from kcache.store.kernel_dirs import triton_cache_dir

    dest = Path(args.dest) if args.dest else triton_cache_dir()
    client = _client(args)
    keys = [e.key for e in client.list_kernels()] if args.all else args.keys
    if not keys:
        raise SystemExit("kcache pull: give KEY... or --all")
    progress = Progress("pull", len(keys))
    outcomes: dict[str, int] = {}
    bad = 0
    for key, pack in client.batch_get(keys):
        try:
            outcome = emit_pack(dest, pack, expected_key=key, check_target=not args.no_target_check)
            outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
        except PackError as exc:
            bad += 1
            print(f"refused {key}: {exc}", file=sys.stderr)
        progress.advance(len(pack))
    progress.close()
    got = sum(outcomes.values()) + bad
    detail = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
    print(
        f"pulled {got} of {plural(len(keys), 'kernel')} ({_size_text(progress.nbytes)}) in {progress.seconds:.2f}s"
        f" into {dest}: {detail or 'none'}; {len(keys) - got} not found, {bad} refused"
    )
    emitted = outcomes.get(EmitOutcome.EMITTED.value, 0) + outcomes.get(EmitOutcome.EXISTING.value, 0)
    return 0 if (emitted or not keys) and not bad else 1


def _warm(args: argparse.Namespace) -> int:
    """Prefetch a workload ahead of time (container entrypoint, image build): kernel packs and
    entries into kcache's local tier (and kernel dirs into ``--dest``, if given), so the job
    itself needs no network: its Triton cache manager emits each kernel from the local tier into
    whichever dir that job's Triton or Inductor uses."""
    from dataclasses import replace

    from kcache.store.fingerprint import current
    from kcache.store.local_store import LocalEntryStore
    from kcache.transport.workload import fetch_view, pull_workload

    client = _client(args)
    view = fetch_view(client, args.workload)
    if view is None:
        print(f"kcache warm: no workload {args.workload!r} in namespace {client.config.namespace!r}", file=sys.stderr)
        return 1
    if view.runs == 0:
        known = "; ".join(fp.describe() for fp in view.other_fingerprints)
        print(f"kcache warm: workload {args.workload!r} has no runs for this environment ({current().describe()}); it has: {known}", file=sys.stderr)
        return 1
    dest = Path(args.dest) if args.dest else None
    config = replace(client.config, local_dir=args.local_dir) if args.local_dir else client.config
    local = LocalEntryStore.of(config)
    import time

    from kcache.cli.progress import Progress

    t0 = time.perf_counter()
    progress = Progress(f"warm {args.workload}", len(view.kernels) + len(view.entries))
    counts = pull_workload(client, view, local, dest, check_target=not args.no_target_check,
                           on_entry=lambda _layer, _key: progress.advance())
    progress.close()
    print(
        f"warmed {args.workload}: {counts['kernels']}/{plural(len(view.kernels), 'kernel')} ({_size_text(counts['kernel_bytes'])}) into {local.root}"
        f"{f' and {dest}' if dest else ''}, "
        f"{counts['entries']}/{plural(len(view.entries), 'entry')} ({_size_text(counts['entry_bytes'])}) into {local.root}, "
        f"{counts['local']} already there, {counts['refused']} refused, in {time.perf_counter() - t0:.2f}s"
    )
    return 0 if counts["refused"] == 0 else 1


def _ls_workloads(args: argparse.Namespace) -> int:
    """Workloads with the environments (fingerprints) their runs were recorded in."""
    from kcache_schemas import wire
    from kcache_schemas.models import WorkloadSummary

    from kcache.store.fingerprint import current

    client = _client(args)
    body = client.get_json(wire.path(wire.WORKLOADS, namespace=client.config.namespace))
    summaries = [WorkloadSummary.model_validate(item) for item in body]
    if args.json:
        print(json.dumps([w.model_dump(mode="json") for w in summaries], indent=2))
        return 0
    here = current().id
    print(f"{'WORKLOAD':32}  {'RUNS':>4}  {'ENV':16}  ENVIRONMENT")
    for w in summaries:
        for fp in w.fingerprints:
            mark = " (this machine)" if fp.id == here else ""
            print(f"{w.name[:32]:32}  {w.runs:>4}  {fp.id:16}  {fp.describe()}{mark}")
    print(f"{plural(len(summaries), 'workload')}; this machine: {current().describe()}", file=sys.stderr)
    return 0


def _first(items: Iterator[T], limit: int | None) -> tuple[list[T], bool]:
    """At most ``limit`` items (all with None), and whether more were left."""
    if limit is None:
        return list(items), False
    taken = list(itertools.islice(items, limit + 1))
    return taken[:limit], len(taken) > limit


def _limit(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of items (e.g. 20)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: at least 1")
    return value


def _ls(args: argparse.Namespace) -> int:
    if args.workloads:
        return _ls_workloads(args)
    if args.entries is not None:
        return _ls_entries(args)
    client = _client(args)
    entries, more = _first(client.list_kernels(prefix=args.prefix or "", page_size=min(args.limit or 500, 500)), args.limit)
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
    else:
        print(f"{'KEY':52}  {'NAME':32}  {'TARGET':12}  {'TRITON':8}  {'FILES':>5}  {'SIZE':>10}  CREATED")
        for e in entries:
            target = f"{e.target.device_type.value}:{e.target.arch}"
            print(f"{e.key:52}  {e.kernel_name[:32]:32}  {target:12}  {e.triton_version[:8]:8}  {len(e.files):>5}  {_size_text(e.total_size):>10}  {e.created_at:%Y-%m-%d %H:%M}")
    print(f"{'the first ' if more else ''}{plural(len(entries), 'kernel')}{'; more: raise --limit' if more else ''}", file=sys.stderr)
    return 0


ALL_LAYERS = "all"


def _ls_entries(args: argparse.Namespace) -> int:
    """Cache entries, layer by layer, keys in the form every command prints and accepts."""
    from kcache_schemas import InvalidKeyError, validate_layer, wire

    from kcache.reporting.report import INTERNAL_LAYERS
    from kcache.store.entry_keys import INDUCTOR_CACHE_IDS, shown

    if args.entries == ALL_LAYERS:
        layers = [layer for layer in wire.ENTRY_LAYERS if layer not in INTERNAL_LAYERS]
    else:
        try:
            layers = [validate_layer(args.entries)]
        except InvalidKeyError as exc:
            raise ConfigError(f"--entries: {exc} (one of {', '.join(wire.ENTRY_LAYERS)})") from None
    client = _client(args)
    prefix = args.prefix or ""
    found: list[tuple[str, EntryInfo]] = []
    more = False
    for layer in layers:
        left = None if args.limit is None else args.limit - len(found)
        if left == 0:
            more = True
            break
        # A short prefix of an Inductor key is looked for inside the form torch stores it in.
        wrapped = f"pt2:{INDUCTOR_CACHE_IDS[layer]}::{prefix}" if prefix and layer in INDUCTOR_CACHE_IDS and not prefix.startswith("pt2:") else prefix
        items, more = _first(client.list_entries(layer, prefix=wrapped, page_size=min(left or 500, 500)), left)
        found += [(layer, info) for info in items]
    if args.json:
        print(json.dumps([{**info.model_dump(mode="json"), "shown_key": shown(layer, info.key)} for layer, info in found], indent=2))
    else:
        width = max([52, *(len(shown(layer, info.key)) for layer, info in found)])  # whole keys, aligned
        print(f"{'LAYER':14}  {'KEY':{width}}  {'SIZE':>10}  {'SIGNED':8}  CREATED")
        for layer, info in found:
            signed = info.signature.key_id[:8] if info.signature else "-"
            print(f"{layer:14}  {shown(layer, info.key):{width}}  {_size_text(info.size):>10}  {signed:8}  {info.created_at:%Y-%m-%d %H:%M}")
    print(f"{'the first ' if more else ''}{plural(len(found), 'entry')}{'; more: raise --limit' if more else ''}", file=sys.stderr)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    if args.entry:
        return _inspect_entry(args)
    entry = _client(args).manifest(args.key)
    if args.json:
        print(entry.model_dump_json(indent=2))
        return 0
    print(f"key            {entry.key}\nkernel         {entry.kernel_name}\nnamespace      {entry.namespace}")
    print(f"target         {entry.target.device_type.value} arch {entry.target.arch} warp {entry.target.warp_size}")
    print(f"triton         {entry.triton_version}\nsize           {_size_text(entry.total_size)} unpacked, {_size_text(entry.pack_size)} packed")
    print(f"created        {entry.created_at.isoformat()}\nproducer       {_fields(entry.producer.model_dump(exclude_none=True))}")
    print("files")
    for f in entry.files:
        print(f"  {f.name:40} {_size_text(f.size):>10}  {f.sha256[:16]}")
    return 0


def _fields(values: dict[str, object]) -> str:
    """``kcache_version=0.1.0 host=n1``: a record for people, not a Python dict."""
    return " ".join(f"{k}={v}" for k, v in values.items()) or "-"


def _inspect_entry(args: argparse.Namespace) -> int:
    """An entry's metadata, who signed it with what provenance, and whether this machine's
    signing settings accept it (exit 1 if they refuse it)."""
    from kcache_schemas import InvalidKeyError, normalize_entry_key, validate_layer
    from kcache_schemas import signed_envelope as envelope
    from kcache_schemas.signed_envelope import SignatureError

    from kcache.transport.entry_signing import LEGACY_HMAC_MAGIC, EntrySigning

    try:
        layer, given = validate_layer(args.entry), normalize_entry_key(args.key)
    except InvalidKeyError as exc:
        raise ConfigError(str(exc)) from None
    client = _client(args)
    key, found = find_entry(client, layer, given)
    if found is None:
        return _print_quarantine(client.quarantine_info(layer, key), args.json)
    info = found
    stored, _ = client.get_entry(layer, key)
    header = None
    if envelope.is_signed(stored):
        try:
            header = envelope.parse(stored).header
        except SignatureError as exc:
            print(f"kcache inspect: damaged signature envelope: {exc}", file=sys.stderr)
    signing = EntrySigning.from_config(client.config)
    accepted: bool | None = None
    verdict = "not checked: no KCACHE_TRUSTED_KEYS, KCACHE_SIGNING_PRIVATE_KEY or KCACHE_SIGNING_KEY set here"
    if signing is not None:
        try:
            signing.open(layer, key, stored)
            accepted, verdict = True, "accepted: signed by a key trusted here"
        except SignatureError as exc:
            accepted, verdict = False, f"refused ({exc.reason}): {exc}"
    if args.json:
        print(json.dumps({
            "info": info.model_dump(mode="json"),
            "signature": header.model_dump(mode="json") if header else None,
            "accepted": accepted, "verdict": verdict,
        }, indent=2))
        return 1 if accepted is False else 0
    from kcache.store.entry_keys import shown

    print(f"layer          {info.layer}\nkey            {shown(layer, info.key)}\nnamespace      {info.namespace}")
    if shown(layer, info.key) != info.key:
        print(f"stored as      {info.key}  (the REST API's key: torch's form)")
    print(f"size           {_size_text(info.size)}\nsha256         {info.sha256}\nstored         {info.created_at.isoformat()}")
    print(f"producer       {_fields(info.producer.model_dump(exclude_none=True))}")
    if header is not None:
        prov = header.provenance
        env = ", ".join(f"{k} {v}" for k, v in prov.environment.items() if v) or "unknown"
        print(f"signed by      {header.alg} key {header.key_id}")
        print(f"  host         {prov.host}\n  run          {prov.run_id or '-'}\n  signed at    {prov.created_at.isoformat()}")
        print(f"  environment  {env}\n  kcache       {prov.kcache_version}\n  payload      {header.payload_size} bytes, sha256 {header.payload_sha256}")
        checked = "yes, against a key registered for this namespace" if info.signature and info.signature.verified else "no (no keys registered for this namespace, or HMAC)"
        print(f"  service checked  {checked}")
    elif stored.startswith(LEGACY_HMAC_MAGIC):
        print("signed by      hmac-sha256 (kcache 0.1 envelope: no key id, no provenance)")
    else:
        print("signed by      nobody: the entry is unsigned")
    print(f"here           {verdict}")
    return 1 if accepted is False else 0


def find_entry(client: KcacheClient, layer: str, given: str) -> tuple[str, EntryInfo | None]:
    """The key an entry given in either form (Inductor's own, or as stored) is stored under,
    with its info; None for the info when that key is quarantined. NotFound names what was
    looked for."""
    from kcache.store.entry_keys import stored_forms

    forms = stored_forms(layer, given)
    for key in forms:
        try:
            return key, client.entry_info(layer, key)
        except Quarantined:
            return key, None
        except NotFound:
            continue
    also = f" (looked for {' and '.join(repr(f) for f in forms)})" if len(forms) > 1 else ""
    raise NotFound(f"no {layer} entry {given!r} in namespace {client.config.namespace!r}{also}; "
                   f"kcache ls --entries {layer} lists them")


def _print_quarantine(q: QuarantineInfo, as_json: bool) -> int:
    """A quarantined entry (a node reported torch could not load it): why, when, and what was
    stored. Exit 1: no node is served it."""
    if as_json:
        print(json.dumps({"quarantine": q.model_dump(mode="json"), "accepted": False,
                          "verdict": f"quarantined: {q.reason}"}, indent=2))
        return 1
    print(f"layer          {q.layer}\nkey            {q.key}\nnamespace      {q.namespace}")
    print(f"QUARANTINED    {q.quarantined_at.isoformat()} by {q.reporter or 'an unnamed client'}: served to no node, uploads refused")
    print(f"  reason       {q.reason}")
    if q.entry is not None:
        print(f"  was          {q.entry.size} bytes, sha256 {q.entry.sha256}, stored {q.entry.created_at.isoformat()}")
        if q.entry.signature is not None:
            prov = q.entry.signature.provenance
            print(f"  signed by    {q.entry.signature.alg} key {q.entry.signature.key_id}, host {prov.host}, run {prov.run_id or '-'}")
    print("  lift it      DELETE .../quarantine with an admin token (the entry itself is gone)")
    return 1


def _keygen(args: argparse.Namespace) -> int:
    """A new Ed25519 key pair: ``PREFIX.key`` (private, 0600) and ``PREFIX.pub``."""
    import getpass
    import socket

    from kcache.transport.entry_signing import SigningUnavailable, generate_key_pair

    private, public = Path(f"{args.out}.key"), Path(f"{args.out}.pub")
    for path in (private, public):
        if path.exists():
            print(f"kcache keygen: {path} exists; not overwriting a key", file=sys.stderr)
            return 1
    try:
        pem, line, key_id = generate_key_pair(args.comment or f"{getpass.getuser()}@{socket.gethostname()}")
    except SigningUnavailable as exc:
        print(f"kcache keygen: {exc}", file=sys.stderr)
        return 2
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public.write_text(line + "\n")
    print(f"key id {key_id}")
    print(f"{private}: the private key; producers only: KCACHE_SIGNING_PRIVATE_KEY={private.resolve()}")
    print(f"{public}: the public key; consumers: KCACHE_TRUSTED_KEYS={public.resolve()}; the service: KCACHE_PRODUCER_KEYS")
    return 0


def _gc(args: argparse.Namespace) -> int:
    """Scan and plan on the service, show the plan, then evict: with ``--yes``, or after a yes at
    the prompt when stdin is a terminal; ``--dry-run`` only shows it (huggingface_hub's
    scan -> plan -> dry-run -> execute)."""
    from kcache_schemas import wire
    from kcache_schemas.gc_models import GcReport, GcRequest
    from pydantic import ValidationError

    try:
        request = GcRequest(max_bytes=args.max_bytes, min_age_s=args.min_age, older_than_s=args.older_than,
                            env=args.env, orphans=args.orphans, dry_run=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = {"max_bytes": "--max-bytes", "min_age_s": "--min-age", "older_than_s": "--older-than"}.get(str(first["loc"][0]), str(first["loc"][0]))
        print(f"kcache gc: {flag}: {first['msg']}", file=sys.stderr)
        return EXIT_USAGE
    # A GC of a large namespace on S3 takes minutes: the service answers when it is done.
    client = _client(args, read_timeout_s=args.timeout)
    path = wire.path(wire.GC, namespace=client.config.namespace)

    def run(dry_run: bool) -> GcReport:
        from kcache.cli.progress import Waiting

        body = request.model_copy(update={"dry_run": dry_run}).model_dump(exclude_none=True)
        with Waiting(f"gc: the service is {'planning' if dry_run else 'evicting'}"):
            answer = client.post_json(path, body)
        report = GcReport.model_validate(answer)
        print(report.model_dump_json(indent=2) if args.json else format_gc_report(report))
        return report

    if args.yes and not args.dry_run:
        run(dry_run=False)
        return EXIT_OK
    plan = run(dry_run=True)
    if args.dry_run:
        return EXIT_OK
    items = sum(a.entries for a in plan.planned.values()) + plan.orphans.entries
    if items == 0:
        return EXIT_OK
    nbytes = sum(a.bytes for a in plan.planned.values()) + plan.orphans.bytes
    declined = confirm("gc", "evict", f"{plural(items, 'item')} ({_size_text(nbytes)}) from namespace {plan.namespace!r}")
    if declined is not None:
        return declined
    run(dry_run=False)  # the service plans again: what was used meanwhile is kept
    return EXIT_OK


def confirm(command: str, verb: str, what: str) -> int | None:
    """Ask before deleting (no ``--yes`` given): None on a yes at the terminal; otherwise the exit
    code, having said that nothing was deleted: 1 where stdin is no terminal to ask (a script
    that forgot ``--yes`` must not pass), 0 on a no."""
    if not sys.stdin.isatty():
        print(f"kcache {command}: nothing deleted: pass --yes to {verb} {what} (stdin is not a terminal to ask)", file=sys.stderr)
        return EXIT_FAILED
    try:
        answer = input(f"{verb.capitalize()} {what}? This cannot be undone. [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print(f"kcache {command}: nothing deleted", file=sys.stderr)
        return EXIT_OK
    return None


def _rm(args: argparse.Namespace) -> int:
    """Delete kernels, or a layer's entries, by key (admin token): every key is looked up first
    and a key that is not stored deletes nothing at all; then, like gc, ``--dry-run`` shows the
    plan, ``--yes`` (or a yes at the prompt) deletes."""
    from kcache_schemas import (
        InvalidKeyError,
        normalize_entry_key,
        normalize_kernel_key,
        validate_layer,
        wire,
    )

    from kcache.store.entry_keys import shown

    try:
        layer = validate_layer(args.entry) if args.entry else None
        given = [normalize_entry_key(k) if layer else normalize_kernel_key(k) for k in args.keys]
    except InvalidKeyError as exc:
        raise ConfigError(str(exc)) from None
    client = _client(args)
    ns = client.config.namespace
    plan: list[tuple[str, str, int]] = []  # (stored key, shown key, size)
    missing: list[str] = []
    for key in dict.fromkeys(given):
        try:
            if layer is None:
                plan.append((key, key, client.manifest(key).pack_size))
            else:
                stored, info = find_entry(client, layer, key)
                if info is None:
                    missing.append(f"{key} (quarantined: no node is served it; an admin lifts it with DELETE .../quarantine)")
                else:
                    plan.append((stored, shown(layer, stored), info.size))
        except NotFound:
            missing.append(key)
    what = plural(len(given), f"{layer} entry" if layer else "kernel").split(" ", 1)[1]  # "kernels", "fx-graph entry"
    if missing:
        print(f"kcache rm: nothing deleted: no {what} {', '.join(missing)} in namespace {ns!r} "
              f"(kcache ls{' --entries ' + layer if layer else ''} lists them)", file=sys.stderr)
        return EXIT_FAILED
    total = sum(size for _, _, size in plan)
    for _, key, size in plan:
        print(f"{'would delete' if args.dry_run else 'delete'}  {layer or 'kernel'} {key}  {_size_text(size)}")
    summary = f"{len(plan)} {what} ({_size_text(total)}) from namespace {ns!r}"
    if args.dry_run:
        print(f"kcache rm: dry run: {summary} would be deleted", file=sys.stderr)
        return EXIT_OK
    if not args.yes:
        declined = confirm("rm", "delete", summary)
        if declined is not None:
            return declined
    for stored, _, _ in plan:
        path = wire.path(wire.KERNEL, namespace=ns, key=stored) if layer is None else wire.path(wire.ENTRY, namespace=ns, layer=layer, key=stored)
        client.delete(path)
    print(f"deleted {summary}")
    return EXIT_OK


def format_gc_report(r: GcReport) -> str:
    """The plan (what, how many bytes, why) and what was done, for people."""
    from datetime import datetime

    from kcache_schemas.gc_models import REASON_BUDGET, REASON_ENV, REASON_TTL
    from kcache_schemas.units import format_bytes as size
    from kcache_schemas.units import format_duration as ago

    from kcache.store.entry_keys import shown

    p = r.policy

    def amount(entries: int, nbytes: int, what: str = "items") -> str:
        return f"{entries:>7} {what:6} {size(nbytes):>10}"

    limits = ", ".join(f"{name} limit {size(v)}" for name, v in (("soft", p.soft_limit_bytes), ("hard", p.hard_limit_bytes)) if v is not None) or "no limit"
    lines = [f"kcache gc: namespace {r.namespace!r}{' (dry run: nothing is deleted)' if r.dry_run else ''}",
             f"  stored    {amount(r.before.entries, r.before.bytes)}   {limits}; min age {ago(p.min_age_s)}"]
    why = {
        REASON_ENV: "built for environment " + ", ".join(f"{k}={v}" for k, v in (r.env or {}).items()) if r.env else "built for an environment unused for " + ago(p.env_idle_s or 0),
        REASON_TTL: f"not used for {ago(p.ttl_s or 0)}",
        REASON_BUDGET: f"least recently used, down to {size(r.target_bytes or 0)}",
    }
    lines.append("  plan")
    for reason in (REASON_ENV, REASON_TTL, REASON_BUDGET):
        if reason in r.planned:
            a = r.planned[reason]
            lines.append(f"    {reason:7} {amount(a.entries, a.bytes)}   {why[reason]}")
    if r.orphans.entries or not r.planned:
        lines.append(f"    {'orphans':7} {amount(r.orphans.entries, r.orphans.bytes, 'blobs')}   no record references them" if r.orphans.entries else "    nothing to evict")
    if r.kept_recent.entries:
        lines.append(f"  kept      {amount(r.kept_recent.entries, r.kept_recent.bytes)}   used within the last {ago(p.min_age_s)} (min age)")
    if r.kept_pinned.entries:
        lines.append(f"  kept      {amount(r.kept_pinned.entries, r.kept_pinned.bytes)}   pinned: {', '.join(r.pins)}")
    if r.items:
        lines.append("  first evictions (least recently used first)")
        now = r.started_at
        for item in r.items[:20]:
            used = datetime.fromtimestamp(item.last_used).strftime("%Y-%m-%d %H:%M")
            # The whole key, as every command prints and accepts it (was cut at 52 characters).
            key = shown(item.kind.removeprefix("entry/"), item.key)
            lines.append(f"    {item.kind[:18]:18} {key:52} {size(item.size):>9}  last used {used} ({ago(max(0.0, now - item.last_used))} ago)  {item.reason}")
        more = len(r.items) - 20 + r.more_items
        if more > 0:
            lines.append(f"    … and {more} more")
    if not r.dry_run:
        done = sum(a.entries for a in r.evicted.values()), sum(a.bytes for a in r.evicted.values())
        lines.append(f"  done      evicted {plural(done[0], 'item')} ({size(done[1])}); {r.skipped} kept (used or replaced meanwhile); "
                     f"{plural(r.blobs_deleted.entries, 'blob')} deleted ({size(r.blobs_deleted.bytes)}), {r.blobs_shared} kept (another record uses them)"
                     + (f"; {r.orphans.entries} orphan blobs deleted ({size(r.orphans.bytes)})" if r.orphans.entries else ""))
    lines.append(f"  {'after' if r.dry_run else 'now':9} {amount(r.after.entries, r.after.bytes)}   in {r.seconds:.3f} s")
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def _pin(args: argparse.Namespace) -> int:
    """Pin a workload (its kernels and entries are never evicted); without a name, list pins."""
    from kcache_schemas import wire
    from kcache_schemas.gc_models import Pin, PinList

    client = _client(args)
    ns = client.config.namespace
    if not args.workload:
        pins = PinList.model_validate(client.get_json(wire.path(wire.PINS, namespace=ns)))
        for p in pins.items:
            print(f"{p.workload:32}  pinned {p.pinned_at:%Y-%m-%d %H:%M}")
        print(f"{plural(len(pins.items), 'pinned workload')} in namespace {ns!r}", file=sys.stderr)
        return 0
    path = wire.path(wire.PIN, namespace=ns, name=args.workload) + (f"?{wire.PIN_AHEAD}=true" if args.ahead else "")
    try:
        pin = Pin.model_validate(client.put_json(path, ""))
    except NotFound:
        print(f"kcache pin: no workload {args.workload!r} in namespace {ns!r}: no run of it is published "
              "(kcache ls --workloads lists them); --ahead pins it before its first run", file=sys.stderr)
        return EXIT_FAILED
    print(f"pinned workload {pin.workload!r} in namespace {ns!r} (since {pin.pinned_at:%Y-%m-%d %H:%M}): "
          "the kernels and entries its runs list are never evicted")
    return 0


def _unpin(args: argparse.Namespace) -> int:
    from kcache_schemas import wire

    client = _client(args)
    ns = client.config.namespace
    client.delete(wire.path(wire.PIN, namespace=ns, name=args.workload))
    print(f"unpinned workload {args.workload!r} in namespace {ns!r}: the GC may evict what only it kept")
    return 0


def _explain(args: argparse.Namespace) -> int:
    """``kcache explain``: why each miss missed (0 also when nothing missed; 1 without input)."""
    import json

    from kcache.reporting.explanations import explain_key, explain_misses
    from kcache.reporting.report import fetch_run
    from kcache.store.counters import load_stats
    from kcache.store.fingerprint import current

    if args.key_option:
        if args.layer or args.key:
            print("kcache explain: give --key KEY or LAYER KEY, not both", file=sys.stderr)
            return 1
        args.layer, args.key = key_layer(args.key_option)
    given = [bool(args.file), bool(args.run), bool(args.layer)]
    if sum(given) != 1 or (args.layer and not args.key):
        print("kcache explain: give --file STATS, --run ID, --key KEY, or LAYER KEY", file=sys.stderr)
        return 1
    client = _client(args)
    if args.layer:
        explanations = [explain_key(client, args.layer, args.key, workload=args.workload,
                                    environment=current() if args.workload else None)]
    else:
        try:
            doc = load_stats(args.file) if args.file else fetch_run(args, args.run)
        except (FileNotFoundError, ValueError) as exc:
            print(f"kcache explain: {exc}", file=sys.stderr)
            return 1
        if not doc.missed:
            print("no misses recorded (a process records the lookups that missed locally and remotely)")
            return 0
        explanations = explain_misses(client, doc.missed, workload=doc.workload, environment=doc.environment)
    if args.json:
        print(json.dumps([{"layer": e.layer, "key": e.key, "nearest": e.nearest, "note": e.note,
                           "changes": [c.model_dump() for c in e.changes],
                           "unsound": e.unsound.model_dump(mode="json") if e.unsound is not None else None}
                          for e in explanations], indent=1))
    else:
        print("\n\n".join(e.render() for e in explanations))
    return 0


def _local_root(args: argparse.Namespace) -> Path:
    from kcache.config import ClientConfig

    return Path(args.local_dir) if args.local_dir else ClientConfig.from_env(given_as=_flag, url=args.url).local_root()


def _local_ls(args: argparse.Namespace) -> int:
    """The node's local tier by service, namespace and layer (huggingface_hub's scan-cache)."""
    from datetime import datetime

    from kcache.cli.local_tier import scan
    from kcache.store.local_store import service_id

    config = ClientConfig.from_env(given_as=_flag, url=args.url)
    root = _local_root(args)
    found = scan(root)
    here = service_id(config.url) if config.url else None
    groups = found.groups()
    if args.json:
        print(json.dumps({"root": str(root), "bytes": found.size, "budget": config.local_max_bytes or None, "groups": [
            {"service": g.service, "this_url": g.service == here, "namespace": g.namespace, "layer": g.layer,
             "files": g.files, "bytes": g.size, "last_used": g.last_used} for g in groups]}, indent=2))
        return EXIT_OK
    print(f"{'SERVICE':18}  {'NAMESPACE':16}  {'LAYER':16}  {'FILES':>6}  {'SIZE':>10}  LAST USED")
    for g in groups:
        mark = "*" if g.service == here else " "
        print(f"{g.service}{mark}  {g.namespace[:16]:16}  {g.layer[:16]:16}  {g.files:>6}  {_size_text(g.size):>10}  "
              f"{datetime.fromtimestamp(g.last_used):%Y-%m-%d %H:%M}")
    budget = _size_text(config.local_max_bytes) if config.local_max_bytes else "no limit"
    print(f"{root}: {plural(len(found.files), 'file')}, {_size_text(found.size)} of {budget} (KCACHE_LOCAL_MAX_BYTES)"
          + (f"; * = {config.url}" if here and any(g.service == here for g in groups) else ""), file=sys.stderr)
    return EXIT_OK


def _local_rm(args: argparse.Namespace) -> int:
    """Delete from the node's local tier what the selection names (no selector: all of it): the
    plan, then ``--yes`` or a yes at the prompt (huggingface_hub's delete-cache). Jobs running
    meanwhile see a miss and ask the service."""
    from kcache_schemas import InvalidKeyError, validate_layer, validate_namespace
    from kcache_schemas.units import format_duration

    from kcache.cli.local_tier import delete, scan, select

    try:
        namespace = validate_namespace(args.namespace) if args.namespace else None
        layer = validate_layer(args.layer) if args.layer else None
    except InvalidKeyError as exc:
        raise ConfigError(str(exc)) from None
    url = ClientConfig.from_env(given_as=_flag, url=args.url).url if args.url else None
    root = _local_root(args)
    found = scan(root)
    chosen = select(found, url=url, namespace=namespace, layer=layer, unused_for_s=args.older_than)
    named = ", ".join(x for x in (f"service {url}" if url else "", f"namespace {namespace}" if namespace else "",
                                   f"layer {layer}" if layer else "",
                                   f"unused for {format_duration(args.older_than)}" if args.older_than is not None else "") if x) or "everything"
    what = f"{plural(len(chosen), 'file')} ({_size_text(sum(f.size for f in chosen))}) of {_size_text(found.size)} in {root} ({named})"
    if not chosen:
        print(f"kcache local rm: nothing to delete: no file in {root} matches ({named})", file=sys.stderr)
        return EXIT_OK
    if args.dry_run:
        print(f"would delete {what}")
        return EXIT_OK
    if not args.yes:
        declined = confirm("local rm", "delete", what)
        if declined is not None:
            return declined
    count, nbytes = delete(chosen)
    print(f"deleted {plural(count, 'file')} ({_size_text(nbytes)}) from {root}")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    """The effective settings and where they came from, the layers, the local tier, signing, and
    whether the service answers and takes this token: exit 1 when something stops kcache."""
    from kcache.cli.doctor import checkup

    c = checkup(args.url, args.token, args.namespace, offline=args.offline)
    print(json.dumps(c.as_json(), indent=2) if args.json else c.render())
    return EXIT_FAILED if c.problems else EXIT_OK


def key_layer(key: str) -> tuple[str, str]:
    """``(layer, key)`` of ``--key``: ``LAYER:KEY`` names its layer; else Triton's kernel keys
    are 52 upper-case base32 characters (or 64 hex), and anything else is taken for an FX graph
    (Inductor's ``f...`` key or its stored form ``pt2:fx-graph-v1::...:c1``)."""
    import re

    from kcache_schemas import wire

    layer, sep, rest = key.partition(":")
    if sep and rest and (layer in wire.ENTRY_LAYERS or layer == wire.CacheLayer.KERNEL.value):
        return layer, rest
    if re.fullmatch(r"[A-Z2-7]{52}|[0-9a-fA-F]{64}", key):
        from kcache_schemas import normalize_kernel_key

        return wire.CacheLayer.KERNEL.value, normalize_kernel_key(key)
    return wire.CacheLayer.FX_GRAPH.value, key


def _purge(args: argparse.Namespace) -> int:
    """Scan the recorded key parts on the service and show what matches; delete it with
    ``--yes`` or a yes at the prompt (as ``kcache gc``)."""
    from kcache_schemas import wire
    from kcache_schemas.purge import PurgeReport, PurgeRequest
    from pydantic import ValidationError

    try:
        request = PurgeRequest(where=args.where, dry_run=True, max_scan=args.max_scan)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"kcache purge: --where: {str(first['msg']).removeprefix('Value error, ')}", file=sys.stderr)
        return EXIT_USAGE
    client = _client(args, read_timeout_s=args.timeout)
    path = wire.path(wire.PURGE, namespace=client.config.namespace)

    def run(dry_run: bool) -> PurgeReport:
        body = request.model_copy(update={"dry_run": dry_run}).model_dump()
        report = PurgeReport.model_validate(client.post_json(path, body))
        print(report.model_dump_json(indent=2) if args.json else format_purge_report(report))
        return report

    if args.yes and not args.dry_run:
        run(dry_run=False)
        return EXIT_OK
    plan = run(dry_run=True)
    if args.dry_run or plan.matched == 0:
        return EXIT_OK
    what = f"{plural(plan.matched, 'entry')} ({_size_text(plan.bytes)}) from namespace {plan.namespace!r}"
    if not sys.stdin.isatty():
        print(f"kcache purge: nothing deleted: pass --yes to delete {what} (stdin is not a terminal to ask)", file=sys.stderr)
        return EXIT_FAILED
    try:
        answer = input(f"Delete {what}? This cannot be undone. [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("kcache purge: nothing deleted", file=sys.stderr)
        return EXIT_OK
    run(dry_run=False)  # the service scans again: what matches now is deleted
    return EXIT_OK


def format_purge_report(r: PurgeReport) -> str:
    head = f"kcache purge: namespace {r.namespace!r} where {' and '.join(r.where)}{' (dry run: nothing is deleted)' if r.dry_run else ''}"
    lines = [head, f"  scanned   {plural(r.scanned, 'recorded key')}{' (stopped at --max-scan: more may match)' if r.truncated else ''}",
             f"  matched   {plural(r.matched, 'entry')} ({_size_text(r.bytes)})"]
    lines += [f"    {i.layer:14} {i.key[:80]:80} {_size_text(i.size):>10}" for i in r.items]
    if r.matched > len(r.items):
        lines.append(f"    … and {r.matched - len(r.items)} more")
    if not r.dry_run:
        lines.append(f"  deleted   {plural(r.deleted, 'entry')} with their recorded parts, in {r.seconds:.3f} s")
    return "\n".join(lines)


def _stats(args: argparse.Namespace) -> int:
    from kcache.reporting.report import stats_command

    return stats_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kcache", description="Distributed cache for compiled GPU kernels",
        epilog="Sizes: 500MB, 10GB (powers of 1000), 512MiB, 10GiB (powers of 1024), 10G = 10GiB, or bytes. "
               "Durations: 90s, 30m, 12h, 7d, 2w, 1h30m. Exit codes: 0 done, 1 failed, 2 wrong usage or setting "
               "(stats --fail-under: under the bar), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"kcache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def remote(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--url", help="service URL (KCACHE_URL)")
        p.add_argument("--token", help="bearer token (KCACHE_TOKEN)")
        p.add_argument("--namespace", help="namespace (KCACHE_NAMESPACE, default 'default')")
        return p

    serve = sub.add_parser("serve", help="run the cache service (embedded default: files + SQLite)")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1; KCACHE_HOST)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765; KCACHE_PORT)")
    serve.add_argument("--data-dir", default=None, help="data dir (default ~/.cache/kcache/server; KCACHE_DATA_DIR)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (default 1)")
    serve.add_argument("--log-level", default=None, help="debug|info|warning (default info)")
    serve.set_defaults(func=_serve)

    push = remote(sub.add_parser("push", help="upload every complete kernel dir of a Triton cache dir"))
    push.add_argument("dir", nargs="?", help="Triton cache dir (default: $TRITON_CACHE_DIR or ~/.triton/cache)")
    push.set_defaults(func=_push)

    pull = remote(sub.add_parser("pull", help="download kernels and emit them into a Triton cache dir"))
    pull.add_argument("keys", nargs="*", metavar="KEY", help="kernel keys: Triton's 52-char cache-dir names or their 64-hex hashes")
    pull.add_argument("--all", action="store_true", help="every kernel in the namespace")
    pull.add_argument("--dest", help="Triton cache dir (default: $TRITON_CACHE_DIR or ~/.triton/cache)")
    pull.add_argument("--no-target-check", action="store_true", help="emit kernels for other GPUs too")
    pull.set_defaults(func=_pull)

    warm = remote(sub.add_parser("warm", help="prefetch a workload's kernels and cache entries ahead of time"))
    warm.add_argument("workload", help="a workload with a published run in this environment (kcache ls --workloads)")
    warm.add_argument("--dest", help="also write the kernel dirs into this Triton cache dir (default: only kcache's local tier)")
    warm.add_argument("--local-dir", help="kcache's local entry tier (default: $KCACHE_LOCAL_DIR or ~/.cache/kcache/client)")
    warm.add_argument("--no-target-check", action="store_true", help="emit kernels for other GPUs too")
    warm.set_defaults(func=_warm)

    ls = remote(sub.add_parser("ls", help="list kernels in the namespace; --entries: cache entries; --workloads: workloads"))
    ls.add_argument("--prefix", help="key prefix (of Inductor's own key, for fx-graph, aot-autograd, dynamo-pgo entries)")
    ls.add_argument("--limit", type=_limit, metavar="N", help="list at most N (default: all)")
    ls.add_argument("--entries", nargs="?", const=ALL_LAYERS, metavar="LAYER",
                    help="list cache entries: of every layer, or of LAYER (fx-graph, aot-autograd, autotune, triton-module, dynamo, jit, ...)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--workloads", action="store_true", help="list workloads and their environment fingerprints")
    ls.set_defaults(func=_ls)

    inspect = remote(sub.add_parser("inspect", help="show a kernel's manifest, target, sizes and files; --entry: a cache entry's signer and provenance"))
    inspect.add_argument("key", help="a kernel key; with --entry, an entry key (Inductor's own, as kcache prints it, or as stored)")
    inspect.add_argument("--entry", metavar="LAYER", help="KEY is a cache entry of this layer (fx-graph, aot-autograd, autotune, triton-module, ...)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(func=_inspect)

    keygen = sub.add_parser("keygen", help="make an Ed25519 key pair for signing cache entries")
    keygen.add_argument("--out", default="kcache-signing", metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub (default kcache-signing)")
    keygen.add_argument("--comment", help="comment in the public key (default user@host)")
    keygen.set_defaults(func=_keygen)
    gc = remote(sub.add_parser("gc", help="evict to the namespace's storage rules now: print the plan, then, with --yes or a yes at the prompt, execute it (admin token)"))
    gc.add_argument("--max-bytes", metavar="SIZE", type=_size, help="evict least recently used until the namespace holds at most SIZE (e.g. 40GB, 500MiB)")
    gc.add_argument("--min-age", metavar="DURATION", type=_age, help="never evict what was used more recently (e.g. 30m; default: the namespace's, 1h); 0 allows everything")
    gc.add_argument("--older-than", metavar="DURATION", type=_age, help="evict what was not used for DURATION (e.g. 7d, 12h: a unit is required); with --env, only that environment's")
    gc.add_argument("--env", metavar="FINGERPRINT", help="purge an environment: its id (kcache ls --workloads) or torch=..,triton=..,cuda=..,gpu_arch=..")
    gc.add_argument("--orphans", action="store_true", help="also delete blobs no index record references (after a crash mid-write)")
    gc.add_argument("--dry-run", action="store_true", help="print the plan only")
    gc.add_argument("-y", "--yes", action="store_true", help="evict without asking (without it: the plan, then a prompt on a terminal; elsewhere nothing is deleted, exit 1)")
    gc.add_argument("--json", action="store_true", help="the report as JSON")
    gc.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the service to finish (default 900)")
    gc.set_defaults(func=_gc)

    rm = remote(sub.add_parser("rm", aliases=["delete"], help="delete kernels, or cache entries of a layer, by key (admin token): the plan, then --yes or a yes at the prompt"))
    rm.add_argument("keys", nargs="+", metavar="KEY", help="kernel keys (52-char or 64-hex); with --entry, entry keys (Inductor's own or as stored)")
    rm.add_argument("--entry", metavar="LAYER", help="the keys are entries of this layer (fx-graph, aot-autograd, autotune, ...)")
    rm.add_argument("--dry-run", action="store_true", help="show what would be deleted; delete nothing")
    rm.add_argument("-y", "--yes", action="store_true", help="delete without asking (without it: a prompt on a terminal; elsewhere nothing is deleted, exit 1)")
    rm.set_defaults(func=_rm)

    pin = remote(sub.add_parser("pin", help="pin a workload: its kernels and entries are never evicted (admin); no name: list pins"))
    pin.add_argument("workload", nargs="?", help="a workload with a published run (kcache ls --workloads)")
    pin.add_argument("--ahead", action="store_true", help="pin a workload before its first run is published")
    pin.set_defaults(func=_pin)

    unpin = remote(sub.add_parser("unpin", help="unpin a workload (admin)"))
    unpin.add_argument("workload", help="a pinned workload (kcache pin lists them)")
    unpin.set_defaults(func=_unpin)

    explain = remote(sub.add_parser("explain", help="why did it miss: for each miss, the nearest stored key and the parts that differ"))
    explain.add_argument("layer", nargs="?", metavar="LAYER", help="a layer (fx-graph, kernel), with KEY: explain that key")
    explain.add_argument("key", nargs="?", metavar="KEY", help="the missed key (Inductor's or Triton's, or as kcache stores it)")
    explain.add_argument("--file", help="a stats file or dir (KCACHE_STATS_FILE): explain every miss it recorded")
    explain.add_argument("--run", metavar="ID", help="a run on the service: explain every miss its processes recorded")
    explain.add_argument("--key", dest="key_option", metavar="KEY", help="one key (Inductor's, Triton's, or as stored; LAYER:KEY for other layers): "
                         "what a canary found if it is unsound, else its nearest stored key")
    explain.add_argument("--workload", help="with a key: the workload whose stored keys to compare with (default: the namespace's keys of the same computation)")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.set_defaults(func=_explain)

    local = sub.add_parser("local", help="this node's local tier (prefetched and fetched entries and packs): ls, rm")

    def local_help(args: argparse.Namespace) -> int:  # bare `kcache local`: what there is to do
        local.print_help()
        return EXIT_OK

    local.set_defaults(func=local_help)
    local_sub = local.add_subparsers(dest="local_command", metavar="COMMAND")
    local_ls = local_sub.add_parser("ls", help="the tier by service, namespace and layer: files, size, last use; * marks KCACHE_URL's service")
    local_ls.add_argument("--url", help="mark this service's part (default: KCACHE_URL)")
    local_ls.add_argument("--local-dir", help="the tier (default: $KCACHE_LOCAL_DIR or ~/.cache/kcache/client)")
    local_ls.add_argument("--json", action="store_true", help="machine-readable output")
    local_ls.set_defaults(func=_local_ls)
    local_rm = local_sub.add_parser("rm", help="delete what the selection names (none: everything): the plan, then --yes or a yes at the prompt")
    local_rm.add_argument("--url", help="only what came from this service")
    local_rm.add_argument("--namespace", help="only this namespace")
    local_rm.add_argument("--layer", help="only this layer (fx-graph, kernel, autotune, ...)")
    local_rm.add_argument("--older-than", metavar="DURATION", type=_age, help="only what was not used for DURATION (e.g. 7d, 12h: a unit is required)")
    local_rm.add_argument("--local-dir", help="the tier (default: $KCACHE_LOCAL_DIR or ~/.cache/kcache/client)")
    local_rm.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    local_rm.add_argument("-y", "--yes", action="store_true", help="delete without asking (without it: a prompt on a terminal; elsewhere nothing is deleted, exit 1)")
    local_rm.set_defaults(func=_local_rm)

    doctor = remote(sub.add_parser("doctor", help="the effective URL, namespace, token source, layers, local tier and signing, and whether the service answers and takes the token (exit 1 on a problem)"))
    doctor.add_argument("--offline", action="store_true", help="check this machine only; do not call the service")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_doctor)

    purge = remote(sub.add_parser("purge", help="delete entries whose recorded key parts match, e.g. after an upstream key bug (admin token): "
                                  "print what matches, then delete it with --yes or a yes at the prompt"))
    purge.add_argument("--where", action="append", required=True, metavar="NAME=VALUE",
                       help="a condition, repeatable (all must match): a key part as kcache explain names it ('inductor_config[max_autotune]=True', "
                            "'options[num_warps]=8'), torch=, triton=, cuda=, gpu_arch= (the environment it was compiled in), run=ID, producer_key=KEYID")
    purge.add_argument("--max-scan", type=int, default=100_000, metavar="N", help="read at most N recorded keys (default 100000)")
    purge.add_argument("--dry-run", action="store_true", help="print what matches only")
    purge.add_argument("-y", "--yes", action="store_true", help="delete without asking (without it: the plan, then a prompt on a terminal; elsewhere nothing is deleted, exit 1)")
    purge.add_argument("--json", action="store_true", help="the report as JSON")
    purge.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the service to finish (default 900)")
    purge.set_defaults(func=_purge)

    stats = remote(sub.add_parser("stats", help="cache-hit statistics: this machine's, a stats file's or a run's; gate CI with --fail-under"))
    stats.add_argument("--file", help="stats file or dir written via KCACHE_STATS_FILE (default: $KCACHE_STATS_FILE, else this job's run: $KCACHE_RUN_ID or its launcher's id (CI, SLURM, torchrun: kcache doctor shows it), else this machine's: every process since --zero)")
    stats.add_argument("--run", metavar="ID", help="a run on the service (KCACHE_RUN_ID of its processes, or the id derived from their launcher: gh-..., slurm-..., torchrun-...)")
    stats.add_argument("--format", choices=("text", "json", "markdown", "junit"), default="text",
                       help="text (default), json, markdown (a CI step summary) or junit (a CI test report)")
    stats.add_argument("--fail-under", type=hit_rate_bar, metavar="RATE", help="exit 2 if the hit rate is below RATE: 80%%, 80 or 0.8 (a number below 1 is a fraction)")
    stats.add_argument("-o", "--output", help="write the report here instead of stdout")
    stats.add_argument("--zero", action="store_true", help="start this machine's stats (what no --file/--run shows) over")
    stats.set_defaults(func=_stats)
    completion = sub.add_parser("completion", help="a shell completion script: eval \"$(kcache completion bash)\" (zsh likewise; fish: > ~/.config/fish/completions/kcache.fish)")
    completion.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell to complete kcache in")
    completion.set_defaults(func=lambda args: _completion(parser, args.shell))
    return parser


def _completion(parser: argparse.ArgumentParser, shell: str) -> int:
    from kcache.cli.completion import script

    sys.stdout.write(script(shell, parser))
    return EXIT_OK


class _StderrWarnings(logging.Handler):
    """kcache's warnings (a token an open server does not check, ...) on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        print(record.getMessage(), file=sys.stderr)


def _warnings_to_stderr() -> None:
    logger = logging.getLogger("kcache")
    if not any(isinstance(h, _StderrWarnings) for h in logger.handlers):
        handler = _StderrWarnings(logging.WARNING)
        logger.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _warnings_to_stderr()
    if args.command is None:  # bare `kcache`: what there is to do
        parser.print_help()
        return EXIT_OK
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kcache {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ServiceUnavailable as exc:
        print(f"kcache {args.command}: the service did not answer: {exc}\n"
              "  check --url / KCACHE_URL, and that the service runs there", file=sys.stderr)
        return EXIT_FAILED
    except KcacheError as exc:
        print(f"kcache {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    os.environ.setdefault("KCACHE_AUTOLOAD", "0")
    raise SystemExit(main())
