"""Catch-up throughput with landing and tables on S3 vs on local disk: the same data, one run, A B A B.

Per round and variant: a fresh SESSIONS_HOME, the same landed files (local files, or S3 objects put into the
landing prefix), then `ingest` (timed alone: read landing, write raw_events, archive) and the stream's catch-up
(timed alone: read raw_events, sessionize, write sessions/quarantine). The S3 endpoint is a moto server on
loopback in its own process: it shares the 2 cores and is far slower per request than a real object store, so
the ratio is an upper bound on what S3 costs here, not a forecast for AWS.

    .venv/bin/python benchmarks/storage.py             # ~3 min on 2 cores
    .venv/bin/python benchmarks/storage.py --quick     # ~2 min
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import boto3  # noqa: E402

from benchmarks.throughput import log, machine_info  # noqa: E402
from pipelines.config import SessionsConfig  # noqa: E402
from pipelines.core.sample_data import arrival_order, generate_events  # noqa: E402
from pipelines.ingest import ingest  # noqa: E402
from pipelines.job.runtime import get_spark  # noqa: E402
from pipelines.job.stream import catch_up  # noqa: E402


def _moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true",
                       "AWS_EC2_METADATA_DISABLED": "true"})
    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
            return server
        except Exception:  # noqa: BLE001 -- not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _run(variant: str, round_no: int, files: list[bytes], work: Path, spark) -> dict:
    home = work / f"{variant}-{round_no}"
    env = {**os.environ, "SESSIONS_HOME": str(home), "SESSIONS_STATE_PARTITIONS": "2"}
    if variant == "s3":
        prefix = f"s3://bench/{home.name}"
        env.update(SESSIONS_WAREHOUSE_URI=f"{prefix}/tables", SESSIONS_LANDING_URI=f"{prefix}/landing")
    config = SessionsConfig.from_env(env)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for i, body in enumerate(files):
        if variant == "s3":
            client.put_object(Bucket="bench", Key=f"{home.name}/landing/part-{i:04d}.jsonl", Body=body)
        else:
            config.landing.mkdir(parents=True, exist_ok=True)
            (config.landing / f"part-{i:04d}.jsonl").write_bytes(body)
    started = time.monotonic()
    ingested = ingest(config)
    ingest_s = time.monotonic() - started
    started = time.monotonic()
    summary = catch_up(config, spark)
    process_s = time.monotonic() - started
    return {"variant": variant, "round": round_no, "events": ingested.rows, "ingest_s": round(ingest_s, 2),
            "process_s": round(process_s, 2), "total_s": round(ingest_s + process_s, 2),
            "sessions_written": summary.sessions_written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    args = parser.parse_args()
    users, files_n, rounds = (2_000, 4, 1) if args.quick else (20_000, 16, 4)
    load_before = os.getloadavg()
    rounds = args.rounds or rounds
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    events = arrival_order(generate_events(users, 3, seed=5), seed=5)
    per = -(-len(events) // files_n)
    files = ["".join(json.dumps(e) + "\n" for e in events[i * per:(i + 1) * per]).encode() for i in range(files_n)]
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as tmp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = _moto(port)
        try:
            spark = get_spark(SessionsConfig.from_env({**os.environ, "SESSIONS_HOME": tmp}))
            for variant in ("local", "s3"):  # warm-up at full size: JVM, Python workers, S3 client (discarded)
                _run(variant, 0, files, Path(tmp), spark)
            results = []
            for round_no in range(1, rounds + 1):
                for variant in ("local", "s3") if round_no % 2 else ("s3", "local"):
                    results.append(_run(variant, round_no, files, Path(tmp), spark))
                    log(json.dumps(results[-1]))
        finally:
            server.kill()
    by = {v: [r for r in results if r["variant"] == v] for v in ("local", "s3")}
    med = {v: {k: statistics.median(r[k] for r in rows) for k in ("ingest_s", "process_s", "total_s")}
           for v, rows in by.items()}
    report = {"events": results[0]["events"], "files": files_n, "rounds": rounds, "runs": results, "median": med,
              "ratio_s3_over_local": {k: round(med["s3"][k] / med["local"][k], 2) for k in med["local"]},
              "events_per_s": {v: round(results[0]["events"] / med[v]["total_s"]) for v in med},
              "machine": machine_info(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "quick": args.quick}
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "storage.json").write_text(json.dumps(report, indent=2))
    lines = ["# Catch-up: landing and tables on S3 (moto on loopback) vs local disk", "",
             f"{report['events']} events in {files_n} files, {rounds} round(s) A B / B A, medians.", "",
             "| variant | ingest s | process s | total s | events/s |", "|---|---|---|---|---|"]
    for v in ("local", "s3"):
        lines.append(f"| {v} | {med[v]['ingest_s']:.2f} | {med[v]['process_s']:.2f} | {med[v]['total_s']:.2f} | "
                     f"{report['events_per_s'][v]} |")
    lines += ["", f"S3 / local time: {report['ratio_s3_over_local']}", "",
              f"Load average (1, 5, 15 min) before the run: {load_before}, after: {report['loadavg_after']}"]
    (out / "storage.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"ratio_s3_over_local": report["ratio_s3_over_local"], "events_per_s": report["events_per_s"]}))


if __name__ == "__main__":
    main()
