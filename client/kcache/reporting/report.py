"""Cache-hit reports: the one-line summary at exit, ``kcache stats`` (text, JSON, Markdown, JUnit),
``--fail-under``, and sending a process's stats to its run on the service at exit.

Everything here reads a :class:`kcache_schemas.stats_document.StatsDocument`: a local one from
``KCACHE_STATS_FILE`` or a run on the service (``wire.RUN``), whose aggregate converts to one.
Hit rate is ``hits / (hits + misses + errors)``: errors count against it and are always shown on
their own, never folded into misses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree as ET

from kcache_schemas import wire
from kcache_schemas.stats_document import (
    LayerCounts,
    RunAggregate,
    RunStatsReport,
    StatsDocument,
    group_phases,
)
from kcache_schemas.units import format_bytes

from kcache.host.failopen import warn_once
from kcache.host.launchers import EXPLICIT
from kcache.store.counters import Stats, load_stats, write_stats
from kcache.version import __version__

if TYPE_CHECKING:
    from kcache.config import ClientConfig

log = logging.getLogger("kcache")
FORMATS = ("text", "json", "markdown", "junit")
EXIT_UNDER_BAR = 2
# At exit a dead service may cost at most about this long (connect + read), once.
SEND_TIMEOUT_S = 2.0


# ---- numbers -----------------------------------------------------------------------------------


def _mb(n: float) -> str:
    return format_bytes(n)  # 12.3 kB, 4.5 MB: never "0.0 MB" for a small transfer


# kcache's own bookkeeping, not a cache users switch on: the key parts stored beside a missed key
# for `kcache explain`. Counted in the totals, listed apart from the layers.
INTERNAL_LAYERS = (wire.CacheLayer.KEY_COMPONENTS.value,)


def user_layers(doc: StatsDocument) -> dict[str, LayerCounts]:
    return {name: c for name, c in doc.layers.items() if name not in INTERNAL_LAYERS}


def _internal_line(doc: StatsDocument) -> str | None:
    parts = [f"{c.puts} upload{'s' if c.puts != 1 else ''} ({_mb(c.bytes_up)}) of {name}" for name, c in doc.layers.items()
             if name in INTERNAL_LAYERS and (c.puts or c.put_errors)]
    return "kcache's own: " + ", ".join(parts) + " (key parts for kcache explain)" if parts else None


# The tiers of the client's read path, nearest first (kcache.store.tiered_store).
TIERS = tuple(tier.value for tier in wire.ServedBy)


def served_by(c: LayerCounts) -> str:
    """Which tiers served the hits, nearest first: ``3 local, 1 prefetch, 6 service`` ("" when
    none were counted: a document of a client before the tiers were)."""
    known = [f"{c.served_by[t]} {t}" for t in TIERS if c.served_by.get(t)]
    other = [f"{n} {t}" for t, n in sorted(c.served_by.items()) if t not in TIERS and n]
    return ", ".join(known + other)


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.1f}%"


def overall_rate(doc: StatsDocument) -> float | None:
    return doc.hit_rate


def under_bar(rate: float | None, bar: float | None) -> bool:
    """True when a ``--fail-under`` bar is set and the rate is below it (no lookups is below)."""
    return bar is not None and (rate is None or rate < bar)


def describe(doc: StatsDocument) -> str:
    """"run ci-42 (workload bert, namespace default), 8 processes", "run gh-7-1-test (from
    GITHUB_RUN_ID, namespace default), 2 processes" or "3 processes"."""
    parts = []
    extra = []
    if doc.run_id:
        parts.append(f"run {doc.run_id}")
        if doc.run_source and doc.run_source != EXPLICIT:  # the launcher's id: say which
            extra.append(f"from {doc.run_source}")
    if doc.workload:
        extra.append(f"workload {doc.workload}")
    elif doc.workloads:
        extra.append("workloads " + ", ".join(doc.workloads))
    if doc.namespace:
        extra.append(f"namespace {doc.namespace}")
    if extra:
        parts.append(f"({', '.join(extra)})" if parts else ", ".join(extra))  # no "(namespace x)" alone
    n = doc.processes or 1
    text = " ".join(parts)
    return f"{text}, {n} process{'es' if n != 1 else ''}" if text else f"{n} process{'es' if n != 1 else ''}"


# ---- the one-line summary ------------------------------------------------------------------------


def summary_line(doc: StatsDocument) -> str:
    """``kcache: 41 hits, 3 misses, 0 errors (93.2% hit rate) | fx-graph 10/10 | kernel 31/34 |
    12.3 MB down, 0.4 MB up, 0.21 s in kcache, ~38.0 s compile saved``"""
    t = doc.totals()
    rate = "no lookups" if t.hit_rate is None else f"{t.hit_rate:.1f}% hit rate"
    parts = [f"kcache: {t.hits} hits, {t.misses} misses, {t.errors} errors ({rate})"]
    for name, c in doc.layers.items():
        if not c.lookups:
            continue
        piece = f"{name} {c.hits}/{c.lookups}"
        if c.errors:
            piece += f" ({c.errors} errors)"
        parts.append(piece)
    if tiers := served_by(t):
        parts.append(f"served by {tiers}")
    tail = f"{_mb(t.bytes_down)} down, {_mb(t.bytes_up)} up"
    if t.puts or t.put_errors:
        tail += f" ({t.puts} puts" + (f", {t.put_errors} failed" if t.put_errors else "") + ")"
    tail += f", {t.seconds:.2f} s in kcache, ~{t.saved_s:.1f} s compile saved"
    parts.append(tail)
    return " | ".join(parts)


# ---- formats -------------------------------------------------------------------------------------

SAVED_NOTE = ("  (est.: the compile time the producers recorded, of the layer that saved most: layers nest, an\n"
              "  AOTAutograd entry's time covers its FX graphs' and their kernels', so they are not added up)")
_COLUMNS = ("hits", "misses", "errors", "lookups", "hit rate", "puts", "put errors", "down", "up", "kcache s", "saved s")


def _row(c: LayerCounts) -> list[str]:
    return [
        str(c.hits), str(c.misses), str(c.errors), str(c.lookups), _pct(c.hit_rate), str(c.puts), str(c.put_errors),
        _mb(c.bytes_down), _mb(c.bytes_up), f"{c.seconds:.2f}", f"{c.saved_s:.1f}",
    ]


def _reasons(layers: dict[str, LayerCounts], field: str) -> list[tuple[str, str, int]]:
    return [
        (name, reason, n)
        for name, c in layers.items()
        for reason, n in sorted(getattr(c, field).items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def format_text(doc: StatsDocument, fail_under: float | None = None) -> str:
    layers = user_layers(doc)
    t = doc.totals()
    lines = [f"kcache stats: {describe(doc)}", ""]
    rows = [
        ("Lookups", str(t.lookups)),
        ("  hits", str(t.hits)),
        ("  misses", str(t.misses)),
        ("  errors (service unreachable or bad answers; not misses)", str(t.errors)),
        ("Hit rate (hits / lookups)", _pct(t.hit_rate)),
        ("Uploads", str(t.puts)),
        ("Upload errors", str(t.put_errors)),
        ("Skipped (e.g. other GPU target)", str(t.skipped)),
        ("Downloaded", _mb(t.bytes_down)),
        ("Uploaded", _mb(t.bytes_up)),
        ("Time in kcache", f"{t.seconds:.2f} s"),
        ("Compile time saved (est.)", f"{t.saved_s:.1f} s"),
    ]
    if fail_under is not None:
        verdict = "FAIL" if under_bar(t.hit_rate, fail_under) else "pass"
        rows.append((f"Bar (--fail-under {fail_under:g}%)", verdict))
    width = max(len(k) for k, _ in rows)
    lines += [f"{k:<{width}}  {v:>12}" for k, v in rows]
    if t.saved_s:
        lines.append(SAVED_NOTE)
    if layers:
        lines += ["", "Per layer"]
        table = [["layer", *_COLUMNS]] + [[name, *_row(c)] for name, c in layers.items()]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        for r in table:
            lines.append("  " + "  ".join(f"{cell:<{widths[0]}}" if i == 0 else f"{cell:>{widths[i]}}" for i, cell in enumerate(r)))
    if internal := _internal_line(doc):
        lines.append("  " + internal)
    served = [(name, tiers) for name, c in layers.items() if (tiers := served_by(c))]
    if served:
        lines += ["", "Hits served by (local tier / workload prefetch / service)"]
        lines += [f"  {name}: {tiers}" for name, tiers in served]
        if len(served) > 1:
            lines.append(f"  total: {served_by(t)}")
    envs = doc.environment_summaries()
    if envs:
        lines += ["", "Per environment (torch, triton)"]
        table = [["environment", "processes", "hits", "misses", "errors", "hit rate"]] + [
            [e.label, str(e.processes), str(e.hits), str(e.misses), str(e.errors), _pct(e.hit_rate)] for e in envs
        ]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        for r in table:
            lines.append("  " + "  ".join(f"{cell:<{widths[0]}}" if i == 0 else f"{cell:>{widths[i]}}" for i, cell in enumerate(r)))
    for title, field in (("Miss reasons", "miss_reasons"), ("Error kinds", "error_kinds")):
        found = _reasons(layers, field)
        if found:
            lines += ["", title] + [f"  {name}: {reason} x{n}" for name, reason, n in found]
    lines += _phase_lines(doc) + _verification_lines(doc)
    if doc.missed:
        lines += ["", f"Misses recorded: {len(doc.missed)} (why: kcache explain --file/--run)"]
    return "\n".join(lines) + "\n"


def phase_totals(doc: StatsDocument) -> dict[str, float]:
    """Start-up seconds per group (torch's phase timers grouped), plus kcache's own time."""
    groups = group_phases(doc.phases)
    kcache_s = doc.totals().seconds
    if kcache_s:
        groups["kcache (lookups, downloads, local tier)"] = kcache_s
    return groups


def _phase_lines(doc: StatsDocument) -> list[str]:
    groups = phase_totals(doc)
    if not groups:
        return []
    lines = ["", "Start-up phases (s; each group's outermost timer: Dynamo contains AOTAutograd, which contains Inductor, ...)"]
    lines += [f"  {group:<42} {seconds:8.2f}" for group, seconds in sorted(groups.items(), key=lambda kv: -kv[1])]
    top = sorted(doc.phases.items(), key=lambda kv: -kv[1])[:8]
    if top:
        lines += ["  largest timers: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in top)]
    return lines


def _verification_lines(doc: StatsDocument) -> list[str]:
    if not doc.verification:
        return []
    titles = {"fetched_unused": "Fetched, never used", "emitted_then_compiled": "Installed, then compiled anyway",
              "refused": "Refused", "quarantined": "Torch could not load it: quarantined",
              "unprofitable": "Did not pay (loaded slower than its producer compiled it, or Dynamo traced a frame it had not served): quarantined"}
    lines = ["", "Post-install checks"]
    for kind, reasons in doc.verification.items():
        for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {titles.get(kind, kind)}: {reason} x{n}")
    return lines


def _with_rates(c: LayerCounts) -> dict[str, Any]:
    return {**c.model_dump(), "lookups": c.lookups, "hit_rate": c.hit_rate}


def format_json(doc: StatsDocument, fail_under: float | None = None) -> str:
    out: dict[str, Any] = doc.model_dump(mode="json")
    out["layers"] = {name: _with_rates(c) for name, c in doc.layers.items()}
    out["totals"] = _with_rates(doc.totals())
    out["hit_rate"] = doc.hit_rate
    if fail_under is not None:
        out["fail_under"] = fail_under
        out["passed"] = not under_bar(out["hit_rate"], fail_under)
    return json.dumps(out, indent=2, sort_keys=True) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(doc: StatsDocument, fail_under: float | None = None) -> str:
    """For a CI step summary (``>> $GITHUB_STEP_SUMMARY``)."""
    layers = user_layers(doc)
    t = doc.totals()
    head = f"### kcache: {_pct(t.hit_rate)} hit rate"
    if fail_under is not None:
        head += (" ❌ below" if under_bar(t.hit_rate, fail_under) else " ✅ at or above") + f" the {fail_under:g}% bar"
    lines = [head, "", _md(describe(doc)), ""]
    lines.append(f"**{t.hits}** hits, **{t.misses}** misses, **{t.errors}** errors"
                 f" · {_mb(t.bytes_down)} down, {_mb(t.bytes_up)} up"
                 f" · {t.seconds:.2f} s in kcache · ~{t.saved_s:.1f} s compile saved")
    lines += ["", "| layer | " + " | ".join(_COLUMNS) + " |", "|---|" + "---:|" * len(_COLUMNS)]
    for name, c in layers.items():
        lines.append(f"| {_md(name)} | " + " | ".join(_row(c)) + " |")
    lines.append("| **total** | " + " | ".join(f"**{v}**" for v in _row(t)) + " |")
    if internal := _internal_line(doc):
        lines += ["", _md(internal)]
    served = [f"{_md(name)} {tiers}" for name, c in layers.items() if (tiers := served_by(c))]
    if served:
        lines += ["", "**Hits served by** (local tier / workload prefetch / service): " + " · ".join(served)]
    if t.errors:
        lines += ["", f"> **{t.errors} errors**: lookups that failed (service unreachable, timed out or "
                      "answered badly). They count against the hit rate but are not misses."]
    envs = doc.environment_summaries()
    if envs:
        lines += ["", "**Per environment:** " + " · ".join(
            f"{_md(e.label)}: {_pct(e.hit_rate)} ({e.processes} process{'es' if e.processes != 1 else ''})" for e in envs
        )]
    for title, field in (("Miss reasons", "miss_reasons"), ("Error kinds", "error_kinds")):
        found = _reasons(layers, field)
        if found:
            lines += ["", f"**{title}:** " + ", ".join(f"{_md(name)} `{_md(reason)}` x{n}" for name, reason, n in found)]
    return "\n".join(lines) + "\n"


def format_junit(doc: StatsDocument, fail_under: float | None = None) -> str:
    """One ``<testsuite name="kcache">``: an ``overall`` testcase and one per layer; a testcase
    fails when its hit rate is under ``fail_under``; layers with no lookups are skipped."""
    t = doc.totals()
    cases: list[ET.Element] = []
    failures = skipped = 0

    def case(name: str, c: LayerCounts) -> None:
        nonlocal failures, skipped
        el = ET.Element("testcase", classname="kcache", name=name, time=f"{c.seconds:.3f}")
        props = ET.SubElement(el, "properties")
        rate = c.hit_rate
        for key in ("hits", "misses", "errors", "puts", "put_errors", "bytes_down", "bytes_up"):
            ET.SubElement(props, "property", name=key, value=str(getattr(c, key)))
        ET.SubElement(props, "property", name="hit_rate", value="" if rate is None else f"{rate:.2f}")
        for tier in TIERS:
            ET.SubElement(props, "property", name=f"served_by_{tier}", value=str(c.served_by.get(tier, 0)))
        text = f"{c.hits} hits, {c.misses} misses, {c.errors} errors ({_pct(rate)} hit rate)"
        if not c.lookups:
            ET.SubElement(el, "skipped", message="no lookups")
            skipped += 1
        elif under_bar(rate, fail_under):
            fail = ET.SubElement(el, "failure", type="HitRateBelowBar",
                                 message=f"hit rate {_pct(rate)} is below {fail_under:g}%")
            fail.text = text
            failures += 1
        ET.SubElement(el, "system-out").text = text
        cases.append(el)

    case("overall", t)
    for name, c in user_layers(doc).items():
        case(name, c)
    when = datetime.fromtimestamp(doc.ended_at, timezone.utc) if doc.ended_at else datetime.now(timezone.utc)
    suite = ET.Element(
        "testsuite", name="kcache", tests=str(len(cases)), failures=str(failures), errors="0",
        skipped=str(skipped), time=f"{t.seconds:.3f}", timestamp=when.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    props = ET.SubElement(suite, "properties")
    for key in ("run_id", "run_source", "namespace", "workload", "processes"):
        if getattr(doc, key) is not None:
            ET.SubElement(props, "property", name=key, value=str(getattr(doc, key)))
    if fail_under is not None:
        ET.SubElement(props, "property", name="fail_under", value=f"{fail_under:g}")
    suite.extend(cases)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


FORMATTERS = {"text": format_text, "json": format_json, "markdown": format_markdown, "junit": format_junit}


def render(doc: StatsDocument, fmt: str = "text", fail_under: float | None = None) -> str:
    return FORMATTERS[fmt](doc, fail_under)


# ---- at exit -------------------------------------------------------------------------------------


MACHINE_STATS = "stats.json"  # in the local tier's root, beside entries/ and locks/


def machine_stats_path(cfg: ClientConfig) -> Path:
    """This machine's stats: every process that used kcache merged in at exit, until
    ``kcache stats --zero`` (what ``kcache stats`` shows with no argument, like sccache's)."""
    return cfg.local_root() / MACHINE_STATS


def at_exit(cfg: ClientConfig, stats: Stats, service_down: bool = False) -> None:
    """Called when a runtime has closed: merge the process's stats into this machine's, write
    ``KCACHE_STATS_FILE``, print the summary line (``KCACHE_REPORT=1``), send the stats to the
    run on the service (``KCACHE_RUN_ID``, else the launcher's: :mod:`kcache.host.launchers`; not when
    the service is known to be down). Never raises."""
    if not stats.snapshot() and not stats.document().verification:
        # A process that did no cache work (an idle compile worker, a runtime replaced before
        # use) reports nothing: it would only add noise lines and inflate the process count.
        # One whose workload prefetch brought what it never asked for reports that finding.
        return
    try:
        from kcache.reporting.torch_phases import torch_phases
        from kcache.store.fingerprint import current

        stats.set_phases(torch_phases())
        doc = stats.document(run_id=cfg.run_id, run_source=cfg.run_source, workload=cfg.workload,
                             namespace=cfg.namespace, environment=current())
    except Exception as exc:
        warn_once("could not collect stats at exit", exc)
        return
    try:
        write_stats(machine_stats_path(cfg), doc)
    except Exception as exc:  # a read-only HOME: the machine's record is a convenience, not a promise
        log.debug("kcache: could not record this machine's stats: %s", exc)
    if cfg.stats_file:
        try:
            write_stats(cfg.stats_file, doc)
        except Exception as exc:
            warn_once(f"could not write stats to {cfg.stats_file}", exc)
    if cfg.report:
        with contextlib.suppress(Exception):  # stderr closed at exit: nothing to tell
            print(summary_line(doc), file=sys.stderr, flush=True)
    if cfg.run_id and cfg.enabled:
        try:
            send_run_stats(cfg, doc, service_down)
        except Exception as exc:
            if _derived(cfg):  # not asked for: a read-only token (403) or a busy service is no news
                log.debug("kcache: stats for run %s (from %s) not sent: %s", cfg.run_id, cfg.run_source, exc)
            else:
                warn_once(f"could not send stats for run {cfg.run_id}", exc)


def _derived(cfg: ClientConfig) -> bool:
    """Whether the run id is the launcher's (the job did not ask for run stats by name)."""
    return cfg.run_source is not None and cfg.run_source != EXPLICIT


def run_report(doc: StatsDocument, report_id: str | None = None) -> RunStatsReport:
    """What one process's document sends to its run (``wire.RUN_STATS``)."""
    return RunStatsReport(
        report_id=report_id or uuid.uuid4().hex,
        host=(doc.host or "")[:255],
        pid=doc.pid or 0,
        workload=doc.workload,
        run_source=doc.run_source,
        kcache_version=__version__,
        started_at=doc.started_at or 0.0,
        ended_at=doc.ended_at or 0.0,
        environment=doc.environment,
        layers=doc.layers,
        missed=doc.missed,
        phases=doc.phases,
        verification=doc.verification,
    )


def send_run_stats(cfg: ClientConfig, doc: StatsDocument, service_down: bool = False) -> bool:
    """POST this process's stats to its run; skipped while the service is known to be down."""
    from kcache.transport.http import KcacheClient

    if not cfg.run_id or not cfg.url:
        return False
    if service_down:
        if not _derived(cfg):
            warn_once(f"service unreachable; stats for run {cfg.run_id} not sent")
        return False
    short = replace(
        cfg, connect_timeout_s=min(cfg.connect_timeout_s, 0.5), read_timeout_s=min(cfg.read_timeout_s, SEND_TIMEOUT_S),
        retries=0, breaker_failures=1,
    )
    client = KcacheClient(short)
    try:
        # The report id makes a retry idempotent: the service stores one contribution per id.
        client.post_json(wire.path(wire.RUN_STATS, namespace=cfg.namespace, run_id=cfg.run_id), run_report(doc).model_dump(mode="json"))
    finally:
        client.close()
    return True


# ---- kcache stats --------------------------------------------------------------------------------


def fetch_run(args: argparse.Namespace, run_id: str) -> StatsDocument:
    from kcache.config import ClientConfig
    from kcache.transport.http import KcacheClient

    config = ClientConfig.from_env(url=args.url, token=args.token, namespace=args.namespace)
    if not config.url:
        raise SystemExit("kcache stats --run: no service URL: pass --url or set KCACHE_URL")
    config = replace(config, read_timeout_s=max(config.read_timeout_s, 30.0), connect_timeout_s=max(config.connect_timeout_s, 5.0))
    client = KcacheClient(config)
    try:
        body = client.get_json(wire.path(wire.RUN, namespace=config.namespace, run_id=run_id))
    finally:
        client.close()
    return RunAggregate.model_validate(body).document()


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "the start"


def _zero(machine: Path, given: bool) -> int:
    """``kcache stats --zero``: start this machine's stats over (sccache's ``--zero-stats``)."""
    if given:
        print("kcache stats: --zero starts this machine's stats over; it takes no --file or --run", file=sys.stderr)
        return 2
    with contextlib.suppress(FileNotFoundError):
        machine.unlink()
    print(f"kcache stats: this machine's stats start over ({machine})")
    return 0


def stats_command(args: argparse.Namespace) -> int:
    """``kcache stats``: 0 when fine, 2 when under ``--fail-under``, 1 when there is nothing to read."""
    from kcache.exceptions import NotFound

    if args.file and args.run:
        print("kcache stats: give --file or --run, not both", file=sys.stderr)
        return 1
    from kcache.config import ClientConfig

    env = ClientConfig.from_env()
    machine = machine_stats_path(env)
    if args.zero:
        return _zero(machine, given=bool(args.file or args.run))
    source_file = args.file or (None if args.run else env.stats_file)
    # A run id of the launcher's (a CI job, a SLURM job) is this job's run, on the service where
    # its processes sent it; without a service to ask, this machine's stats.
    own_run = env.run_id if env.url or args.url or not _derived(env) else None
    run_id = args.run or (None if source_file else own_run)
    try:
        if source_file:
            doc = load_stats(source_file)
        elif run_id:
            doc = fetch_run(args, run_id)
        elif machine.is_file():
            doc = load_stats(machine)
            print(f"kcache stats: this machine ({machine}): every process since "
                  f"{_when(doc.started_at)}; --file/--run for one job, --zero to start over", file=sys.stderr)
        else:
            print(f"kcache stats: no stats recorded on this machine yet ({machine}: every process that uses kcache "
                  "adds to it at exit); give --file PATH or --run ID (or set KCACHE_STATS_FILE / KCACHE_RUN_ID)", file=sys.stderr)
            return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"kcache stats: {exc}", file=sys.stderr)
        return 1
    except NotFound:
        if args.run or not _derived(env):
            why = "did its processes set KCACHE_RUN_ID?"
        else:
            why = f"this job's id, from {env.run_source}: no process of it has reported yet (none did cache work?)"
        print(f"kcache stats: no run {run_id!r} on the service ({why})", file=sys.stderr)
        return 1
    text = render(doc, args.format, args.fail_under)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    rate = overall_rate(doc)
    if under_bar(rate, args.fail_under):
        why = "no lookups were recorded" if rate is None else f"hit rate {rate:.1f}%"
        print(f"kcache stats: {why} is below --fail-under {args.fail_under:g}%", file=sys.stderr)
        return EXIT_UNDER_BAR
    return 0
