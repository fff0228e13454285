"""What the standing erasure costs ingest: the rows of one ingest commit built by the columnar path (`line_rows`, as
ingest builds them) against the erased-user filter run on those rows (`ErasedUsers.drop_mask`), side by side in one
run, with 0, 1 and 100 erasures in the log. Prints one JSON line per case, with the machine's load.

    .venv/bin/python benchmarks/erasure_filter.py --events 2000000 --users 50000
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow.compute as pc

from pipelines.config import SessionsConfig
from pipelines.ingest.erased import COMPLETE, ErasedUsers, log_erasure, user_hash
from pipelines.ingest.lines import Lines
from pipelines.ingest.table import RowSource, line_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    start = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    lines = [json.dumps({"event_id": f"e{i}", "user_id": f"user-{u}", "page": "/", "event_type": "page_view",
                         "event_time": (start + dt.timedelta(milliseconds=int(ms))).isoformat().replace("+00:00", "Z")})
             .encode() for i, (u, ms) in enumerate(zip(rng.integers(0, args.users, args.events),
                                                       rng.integers(0, 86_400_000, args.events)))]
    source = RowSource("bench.jsonl", Lines.from_pairs(enumerate(lines, 1)))
    config = SessionsConfig.from_env({"SESSIONS_HOME": tempfile.mkdtemp()})
    now = dt.datetime.now(dt.timezone.utc)
    logged = 0
    for erasures in (0, 1, 100):
        for k in range(logged, erasures):
            log_erasure(config, erasure_id=f"e{k}", hashed=user_hash(config, f"user-{k}"), status=COMPLETE,
                        removed={})
        logged = erasures
        rows_s, mask_s = [], []
        for _ in range(args.rounds):  # in turns: rows, then the filter on them
            began = time.perf_counter()
            rows = line_rows([source], 1, now, dt.timedelta(hours=1))
            rows_s.append(time.perf_counter() - began)
            began = time.perf_counter()
            mask = ErasedUsers.load(config).drop_mask(rows["user_id"], rows["event_time"].cast("int64"), rows["raw"])
            mask_s.append(time.perf_counter() - began)
        rows_med, mask_med = statistics.median(rows_s), statistics.median(mask_s)
        print(json.dumps({"erasures_in_log": erasures, "events": args.events, "users": args.users,
                          "rows_s": round(rows_med, 3), "filter_s": round(mask_med, 3),
                          "filter_vs_rows": round(mask_med / rows_med, 3),
                          "dropped": 0 if mask is None else int(pc.sum(mask).as_py() or 0), "load_avg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
