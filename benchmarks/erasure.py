"""`sessionctl forget` as whole commands (process start to exit), alternating in one run on one home: a user with an
open session (the live state is rebuilt: a savepoint and a restore of all of it) and a user no file of the checkpoint
names (landed after the last batch: the checkpoint is left as it is); with `--bulk N`, also N open users in one
request. Users x 2 events, RocksDB, `local[2]`, 4 state partitions (benchmarks/lifecycle.py's state).

    .venv/bin/python benchmarks/erasure.py [--users 10000] [--rounds 2] [--provider rocksdb]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.lifecycle import _sessionctl, state_home  # noqa: E402
from pipelines.core.sample_data import land  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--provider", default="rocksdb")
    parser.add_argument("--bulk", type=int, default=0, help="also N open users erased in one request")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results" / "erasure")
    args = parser.parse_args(argv)
    home, config = state_home("erasure-bench-", args.provider, args.users)
    runs: dict[str, list[float]] = {"open user": [], "user not in the checkpoint": []}
    if args.bulk:
        runs[f"{args.bulk} open users"] = []
    rebuilt: dict[str, list[int]] = {name: [] for name in runs}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        absent = f"absent-{round_}"
        land(config.landing, f"absent-{round_}.jsonl", [json.dumps(
            {"event_id": f"a{round_}", "user_id": absent, "event_time": "2026-11-01T10:05:00Z",
             "event_type": "page_view", "page": "/"})])
        requests = [("open user", [f"u{round_ * 7:07d}"]), ("user not in the checkpoint", [absent])]
        if args.bulk:  # every 13th user from an offset of this round's own: none erased before
            requests.append((f"{args.bulk} open users",
                             [f"u{1 + round_ + 13 * k:07d}" for k in range(args.bulk)]))
        for name, users in requests:
            seconds, answer = _sessionctl(home, args.provider, "forget", *(a for u in users for a in ("--user", u)),
                                          "--json")
            runs[name].append(seconds)
            rebuilt[name].append(answer["removed"]["state_rebuilt"])
            load.append(os.getloadavg()[0])
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "users": args.users,
           "provider": args.provider, "seconds": runs, "state_rebuilt": rebuilt, "loadavg_1m": load}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"forget-{args.provider}-{args.users}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({name: statistics.median(s) for name, s in runs.items()}), json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
