"""Ingest line rules: the per-line path (`classify_line` per line, the specification) vs the columnar path
(pipelines/ingest/columnar.py), side by side in one run on the same lines, with 0%, 1% and 10% hostile lines.

Part 1, the rows alone: `pipelines.ingest.table.line_rows` over one file of --lines lines (a RowSource, as the local
source hands it over): per-line, columnar, and per-line with Python's cyclic GC paused (as the columnar path runs
its fallback lines: how much of the gain is the GC alone), in turns (A B C, C B A, ...), --rounds each; every
table is asserted equal to the per-line table of the same round. Reports lines/s, MB/s and the ratios of the
medians, how many lines the columnar path left to the per-line rules (the fallback), and per hostile kind the
per-line rules' cost per line.

Part 2, a whole `pipelines.ingest.ingest(config)` of one landed file of --lines clean events (read, split, rules,
Delta append, archive), per-line vs columnar, alternating, --ingest-rounds each, a fresh SESSIONS_HOME each time.

The lines are `pipelines.core.sample_data` events (json.dumps, ~136 bytes each); hostile lines replace a fraction of
them, cycling through the kinds of README "Input handling". The machine's load average is recorded around every
timed run: on this shared 2-core machine it is the first thing to check when two runs disagree.

    .venv/bin/python benchmarks/ingest.py                          # 2M lines, 3 rounds: ~20 min on 2 cores
    .venv/bin/python benchmarks/ingest.py --lines 200000 --rounds 3 --ingest-rounds 1    # ~1.5 min
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import arrival_order, generate_events  # noqa: E402
from pipelines.ingest import appender, columnar, ingest  # noqa: E402
from pipelines.ingest.lines import Lines, classify_line, split_lines  # noqa: E402
from pipelines.ingest.table import RowSource, line_rows  # noqa: E402


def _events(count: int, seed: int = 3) -> list[bytes]:
    users = max(1, count // 20)
    events = arrival_order(generate_events(users, 4, seed=seed), seed=seed)
    while len(events) < count:
        users = users * 2
        events = arrival_order(generate_events(users, 4, seed=seed), seed=seed)
    return [json.dumps(e).encode() for e in events[:count]]


def _hostile_kinds() -> list[tuple[str, Callable[[bytes], bytes]]]:
    """(name, line -> hostile line): README "Input handling", one entry per kind of input (valid ones included:
    integer ids, a page object, a BOM, CRLF, a long line are kept by the rules, not rejected)."""
    def field(name: str, value: object) -> Callable[[bytes], bytes]:
        def edit(line: bytes) -> bytes:
            record = json.loads(line)
            record[name] = value
            return json.dumps(record).encode()
        return edit

    def drop(name: str) -> Callable[[bytes], bytes]:
        def edit(line: bytes) -> bytes:
            record = json.loads(line)
            record.pop(name, None)
            return json.dumps(record).encode()
        return edit

    return [
        ("not_json", lambda line: b"not json: " + line[:20]),
        ("cut_off", lambda line: line[:40]),
        ("not_an_object", lambda line: b'["a", 1]'),
        ("missing_event_id", drop("event_id")),
        ("null_user_id", field("user_id", None)),
        ("blank_event_id", field("event_id", " ")),
        ("float_event_id", field("event_id", 679.5)),
        ("integer_event_id (valid)", lambda line: field("event_id", int(json.loads(line)["event_id"][2:]))(line)),
        ("list_user_id", field("user_id", ["u"])),
        ("missing_event_time", drop("event_time")),
        ("naive_event_time", field("event_time", "2026-11-01T08:00:00")),
        ("unparseable_event_time", field("event_time", "yesterday")),
        ("out_of_range_event_time", field("event_time", "9999-12-31T23:59:59-05:00")),
        ("far_future", field("event_time", "9999-12-31T23:59:59Z")),
        ("list_event_type", field("event_type", ["logout"])),
        ("page_object (valid)", field("page", {"path": "/x"})),
        ("invalid_utf8", lambda line: line.replace(b'"user-', b'"\xffuser-', 1)),
        ("surrogate_escape", lambda line: line.replace(b'"user-', b'"\\ud800user-', 1)),
        ("bom (valid)", lambda line: b"\xef\xbb\xbf" + line),
        ("crlf (valid)", lambda line: line + b"\r"),
        ("blank", lambda line: b""),
        ("whitespace", lambda line: b"   "),
        ("deep_nesting", lambda line: line[:-1] + b', "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"),
        ("huge_integer", lambda line: line[:-1] + b', "x": ' + b"9" * 5000 + b"}"),
        ("duplicate_key (valid, last wins)", lambda line: line[:-1] + b', "page": "/dup"}'),
        ("double_overflow (valid)", lambda line: line[:-1] + b', "x": 1e999}'),
        ("two_objects", lambda line: line + b' {"x": 1}'),
        ("long_line (valid)", lambda line: line[:-1] + b', "pad": "' + b"y" * 5000 + b'"}'),
    ]


def _with_hostile(lines: list[bytes], fraction: float, seed: int = 5) -> tuple[list[bytes], dict[str, int]]:
    out = list(lines)
    kinds = _hostile_kinds()
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(lines)), int(len(lines) * fraction)))
    counts: dict[str, int] = {}
    for n, k in enumerate(picked):
        name, edit = kinds[n % len(kinds)]
        out[k] = edit(lines[k])
        counts[name] = counts.get(name, 0) + 1
    return out, counts


def kind_costs(lines: list[bytes], sample: int = 500) -> list[dict[str, Any]]:
    """Per hostile kind: microseconds per line of the per-line rules, and whether the columnar path takes it."""
    limit = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=60)
    out = []
    for name, edit in _hostile_kinds():
        edited = [edit(line) for line in lines[:sample]]
        started = time.perf_counter()
        for line in edited:
            classify_line(line, limit)
        per_line_us = (time.perf_counter() - started) / len(edited) * 1e6
        taken, _ = columnar.fast_rows(Lines.from_pairs(enumerate(edited)), limit)
        out.append({"kind": name, "per_line_us": round(per_line_us, 1), "columnar_takes": len(taken) == len(edited)})
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


VARIANTS = ("per_line", "columnar", "per_line_gc_paused")


def _time_line_rows(sources: list[RowSource], ingested_at: dt.datetime, variant: str) -> tuple[float, Any]:
    """One timed line_rows call. per_line_gc_paused: today's per-line path with Python's cyclic GC paused as the
    columnar path pauses it for its fallback lines (how much of the gain is the GC alone)."""
    pause = columnar.paused_gc() if variant == "per_line_gc_paused" else contextlib.nullcontext()
    started = time.perf_counter()
    with pause:
        table = line_rows(sources, 1, ingested_at, dt.timedelta(minutes=60), per_line=variant != "columnar")
    return time.perf_counter() - started, table


def rows_benchmark(lines: list[bytes], fractions: list[float], rounds: int) -> list[dict[str, Any]]:
    ingested_at = dt.datetime.now(dt.timezone.utc)
    out = []
    for fraction in fractions:
        mixed, counts = _with_hostile(lines, fraction)
        # As the landing sources build it: the file's body and its newline offsets (split_lines).
        sources = [RowSource("bench.jsonl", split_lines(b"".join(raw + b"\n" for raw in mixed), 0, False)[0])]
        size = sum(len(raw) + 1 for raw in mixed)
        taken, _ = columnar.fast_rows(sources[0].lines, ingested_at + dt.timedelta(minutes=60))  # untimed: the fallback share
        runs: list[dict[str, Any]] = []
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            tables = {}
            for variant in order:
                before = _load()
                seconds, table = _time_line_rows(sources, ingested_at, variant)
                tables[variant] = table
                runs.append({"variant": variant, "round": r, "seconds": round(seconds, 3), "rows": table.num_rows,
                             "lines_per_s": round(len(mixed) / seconds), "load_before": before, "load_after": _load()})
                print(json.dumps({"hostile": fraction, **runs[-1]}), flush=True)
            for variant in VARIANTS[1:]:
                assert tables[variant].equals(tables["per_line"]), f"{variant} differs (hostile {fraction}, round {r})"
            del tables
        median = {v: statistics.median(x["seconds"] for x in runs if x["variant"] == v) for v in VARIANTS}
        out.append({
            "hostile_fraction": fraction, "lines": len(mixed), "bytes": size, "hostile_lines": sum(counts.values()),
            "hostile_kinds": counts, "fast_lines": len(taken), "per_line_lines": len(mixed) - len(taken),
            "median_seconds": median,
            "median_lines_per_s": {v: round(len(mixed) / s) for v, s in median.items()},
            "median_mb_per_s": {v: round(size / s / 1e6, 1) for v, s in median.items()},
            "speedup": round(median["per_line"] / median["columnar"], 2),
            "speedup_vs_gc_paused": round(median["per_line_gc_paused"] / median["columnar"], 2),
            "identical": True, "runs": runs,
        })
    return out


def _per_line_rows(sources: Any, seq: int, ingested_at: Any, max_future: Any, **options: Any) -> Any:
    """line_rows on its per-line path (the specification), patched in for the per_line variant."""
    return line_rows(sources, seq, ingested_at, max_future, per_line=True, **options)


def ingest_benchmark(lines: list[bytes], rounds: int, work: Path) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    data = b"".join(raw + b"\n" for raw in lines)
    for r in range(rounds):
        for variant in (("per_line", "columnar") if r % 2 == 0 else ("columnar", "per_line")):
            home = work / f"{variant}-{r}"
            config = SessionsConfig.from_env({"SESSIONS_HOME": str(home)})
            config.landing.mkdir(parents=True, exist_ok=True)
            tmp = config.landing / ".clicks.jsonl.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, config.landing / "clicks.jsonl")
            patch = (mock.patch.object(appender, "line_rows", _per_line_rows) if variant == "per_line"
                     else mock.patch.object(appender, "line_rows", line_rows))
            before = _load()
            with patch:
                started = time.perf_counter()
                result = ingest(config)
                seconds = time.perf_counter() - started
            if result.rows != len(lines):
                raise RuntimeError(f"{variant}: {result.rows} rows, expected {len(lines)}")
            runs.append({"variant": variant, "round": r, "seconds": round(seconds, 3), "rows": result.rows,
                         "events_per_s": round(len(lines) / seconds), "load_before": before, "load_after": _load()})
            print(json.dumps({"ingest": True, **runs[-1]}), flush=True)
    median = {v: statistics.median(x["seconds"] for x in runs if x["variant"] == v) for v in ("per_line", "columnar")}
    return {"events": len(lines), "bytes": len(data), "median_seconds": median,
            "median_events_per_s": {v: round(len(lines) / s) for v, s in median.items()},
            "speedup": round(median["per_line"] / median["columnar"], 2), "runs": runs}


def _markdown(result: dict[str, Any]) -> str:
    rows = ["# Ingest line rules: per-line vs columnar", "",
            f"{result['when']}, {result['cpus']} cores ({result['cpu']}), Python {result['python']}; "
            f"load average (1, 5, 15 min) before {result['load_before']}, after {result['load_after']}.", "",
            f"## `line_rows` over one file of {result['lines']:,} lines, {result['rounds']} rounds each (A B C, C B A, ...), medians",
            "", "| hostile | lines to the per-line rules | per-line s | columnar s | per-line lines/s "
                "| columnar lines/s | columnar MB/s | speedup | per-line, GC paused s | speedup vs it "
                "| tables identical |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        s, ps = r["median_seconds"], r["median_lines_per_s"]
        rows.append(f"| {r['hostile_fraction']:.0%} | {r['per_line_lines']:,} | {s['per_line']:.2f} | "
                    f"{s['columnar']:.2f} | {ps['per_line']:,} | {ps['columnar']:,} | "
                    f"{r['median_mb_per_s']['columnar']} | {r['speedup']}x | {s['per_line_gc_paused']:.2f} | "
                    f"{r['speedup_vs_gc_paused']}x | {'yes' if r['identical'] else 'NO'} |")
    loads = [x["load_before"][0] for r in result["rows"] for x in r["runs"]]
    rows += ["", f"1-minute load before the timed runs: {min(loads)} to {max(loads)}."]
    if result.get("kinds"):
        rows += ["", "Hostile kinds (cycled through in that order): the per-line rules' cost per line (500 lines, "
                     "untimed run) and whether the columnar path takes the line itself.", "",
                 "| kind | per-line rules us/line | taken by the columnar path |", "|---|---:|---|"]
        rows += [f"| {k['kind']} | {k['per_line_us']} | {'yes' if k['columnar_takes'] else 'no'} |"
                 for k in result["kinds"]]
    if result.get("ingest"):
        i = result["ingest"]
        s, ps = i["median_seconds"], i["median_events_per_s"]
        loads = [x["load_before"][0] for x in i["runs"]]
        rows += ["", f"## Whole `ingest(config)` of one landed file of {i['events']:,} clean events "
                     f"({i['bytes'] / 1e6:.0f} MB; read, rules, Delta append, archive), medians of "
                     f"{len(i['runs']) // 2} rounds each", "",
                 "| per-line s | columnar s | per-line events/s | columnar events/s | speedup |",
                 "|---:|---:|---:|---:|---:|",
                 f"| {s['per_line']:.2f} | {s['columnar']:.2f} | {ps['per_line']:,} | {ps['columnar']:,} | "
                 f"{i['speedup']}x |", "", f"1-minute load before the timed runs: {min(loads)} to {max(loads)}."]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per variant and hostile fraction (>= 3)")
    parser.add_argument("--hostile", default="0,0.01,0.1", help="fractions of hostile lines, comma-separated")
    parser.add_argument("--ingest-rounds", type=int, default=3, help="whole-ingest runs per variant (0: skip)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    load_before = _load()
    lines = _events(args.lines)
    result: dict[str, Any] = {
        "benchmark": "ingest", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "lines": len(lines),
        "rounds": args.rounds, "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(), "load_before": load_before,
        "settings": {"fast_max_line": columnar.FAST_MAX_LINE, "group_bytes": columnar.GROUP_BYTES,
                     "max_brackets": columnar.MAX_BRACKETS},
    }
    result["kinds"] = kind_costs(lines)
    result["rows"] = rows_benchmark(lines, [float(f) for f in args.hostile.split(",")], args.rounds)
    if args.ingest_rounds:
        with tempfile.TemporaryDirectory(prefix="ingest-bench-") as work:
            result["ingest"] = ingest_benchmark(lines, args.ingest_rounds, Path(work))
    result["load_after"] = _load()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results_dir / "ingest.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    main()
