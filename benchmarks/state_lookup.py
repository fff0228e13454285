"""`sessionctl state --user U --json` as whole commands (process start to exit), this tree against a baseline tree
(`--baseline DIR`: a checkout of another revision, whose `build/` may be a link to this tree's), alternating A B A B
on one home; and `state --top 1` (a pass over the whole state) in the same run. Users x 2 events, `local[2]`, 4 state
partitions (benchmarks/lifecycle.py's state).

    .venv/bin/python benchmarks/state_lookup.py --baseline /tmp/base [--users 10000] [--rounds 3] [--provider rocksdb]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--provider", default="rocksdb")
    parser.add_argument("--baseline", type=Path, required=True, help="the other revision's tree")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results" / "state_lookup")
    args = parser.parse_args(argv)
    home, config = state_home("lookup-bench-", args.provider, args.users)
    runs: dict[str, list[float]] = {"this tree: state --user": [], "baseline: state --user": [],
                                    "this tree: state --top 1": []}
    answers: dict[str, list[int]] = {name: [] for name in runs}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        user = f"u{round_ * 7:07d}"
        for name, code, command in (("this tree: state --user", REPO, ("state", "--user", user, "--json")),
                                    ("baseline: state --user", args.baseline, ("state", "--user", user, "--json")),
                                    ("this tree: state --top 1", REPO, ("state", "--top", "1", "--json"))):
            seconds, answer = _sessionctl(home, args.provider, *command, code=code)
            runs[name].append(seconds)
            found = answer.get("open_sessions", answer.get("top", []))
            answers[name].append(sum(int(s["events"]) for s in found))
            load.append(os.getloadavg()[0])
    assert answers["this tree: state --user"] == answers["baseline: state --user"], answers
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "users": args.users,
           "provider": args.provider, "baseline": str(args.baseline), "seconds": runs, "events_found": answers,
           "ratio_lookup_vs_baseline": [round(a / b, 3) for a, b in
                                        zip(runs["this tree: state --user"], runs["baseline: state --user"])],
           "loadavg_1m": load}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"state-user-{args.provider}-{args.users}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({name: statistics.median(s) for name, s in runs.items()}), json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
