"""`sessionctl forget` as whole commands (process start to exit), alternating in one run on one home: a user with an
open session (the state partition it is placed in is rewritten in place) and a user no file of the checkpoint names
(landed after the last batch: the checkpoint is left as it is); with `--bulk N`, also N open users in one request
(every partition rewritten). Users x 2 events, `--provider` (RocksDB by default), `local[2]`, 4 state partitions
(benchmarks/lifecycle.py's state). Each forget's `phases` (seconds per step) are kept in the results.

With `--verify`, `sessionctl forget --verify` instead, as whole commands: reading every file (`--full`), the first
verify with the audit's index (which builds it), an indexed verify of an open user, then a `forget` of an open user
and its verifies (the first after the forget, again, and `--full`); then the warehouse is grown `--grow` times over
(other users' events, ingested) and the same again. The indexed verify of a forgotten user should cost about the same
at both sizes, reading only the files that may hold the user.

With `--verify --baseline REV`, the first verify after a forget by REV's build and by this tree's, A B A B: two homes
built alike (an index names its files by path, so each build keeps its own home and index), each index built by its
own build's first verify, then `--rounds` rounds of: a forget of an open user and the verify after it, REV's build in
its home, then this tree's in the other.

    .venv/bin/python benchmarks/erasure.py [--users 10000] [--rounds 2] [--provider rocksdb] [--baseline REV]
    .venv/bin/python benchmarks/erasure.py --verify [--users 1000000] [--grow 3] [--baseline REV --rounds 3]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
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

from benchmarks.lifecycle import _env, _sessionctl, baseline_tree, build_state, state_home  # noqa: E402
from pipelines.core.sample_data import land  # noqa: E402
from pipelines.job.runtime import get_spark, stop_spark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--provider", default="rocksdb")
    parser.add_argument("--bulk", type=int, default=0, help="also N open users erased in one request")
    parser.add_argument("--baseline", help="also an open user's forget by this revision's build, alternating with "
                        "this tree's (another open user each time)")
    parser.add_argument("--verify", action="store_true", help="measure forget --verify instead (see above)")
    parser.add_argument("--grow", type=int, default=3, help="with --verify: the warehouse's second size, in times")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results" / "erasure")
    args = parser.parse_args(argv)
    if args.verify:
        return measure_verify_ab(args) if args.baseline else measure_verify(args)
    home, config = state_home("erasure-bench-", args.provider, args.users)
    runs: dict[str, list[float]] = {"open user": [], "user not in the checkpoint": []}
    if args.bulk:
        runs[f"{args.bulk} open users"] = []
    baseline = None
    if args.baseline:
        baseline = baseline_tree(args.baseline, Path(tempfile.mkdtemp(prefix="erasure-baseline-")))
        runs[f"open user, revision {args.baseline}"] = []
    rebuilt: dict[str, list[int]] = {name: [] for name in runs}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        absent = f"absent-{round_}"
        land(config.landing, f"absent-{round_}.jsonl", [json.dumps(
            {"event_id": f"a{round_}", "user_id": absent, "event_time": "2026-11-01T10:05:00Z",
             "event_type": "page_view", "page": "/"})])
        # The open user of a round is none that a bulk request of any round names (those are below 13 * bulk + rounds).
        requests = [("open user", [f"u{args.users // 2 + round_:07d}"]), ("user not in the checkpoint", [absent])]
        if baseline is not None:  # before this tree's, every round: A B A B
            requests.insert(0, (f"open user, revision {args.baseline}", [f"u{args.users // 3 + round_:07d}"]))
        if args.bulk:  # every 13th user from an offset of this round's own: none erased before
            requests.append((f"{args.bulk} open users",
                             [f"u{1 + round_ + 13 * k:07d}" for k in range(args.bulk)]))
        for name, users in requests:
            seconds, answer = _sessionctl(home, args.provider, "forget", *(a for u in users for a in ("--user", u)),
                                          "--json", code=baseline if name.startswith("open user, revision") else None)
            runs[name].append(seconds)
            rebuilt[name].append(answer["removed"]["state_rebuilt"])
            phases[name].append(answer.get("phases", {}))
            load.append(os.getloadavg()[0])
    if baseline is not None:
        shutil.rmtree(baseline.parent, ignore_errors=True)
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "users": args.users,
           "provider": args.provider, "seconds": runs, "state_rebuilt": rebuilt, "phases": phases, "loadavg_1m": load}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"forget-{args.provider}-{args.users}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({name: statistics.median(s) for name, s in runs.items()}), json.dumps(out))
    return 0


def _verify(home: Path, provider: str, user: str, *full: str, code: Path | None = None) -> dict:
    """`forget --verify` as a whole command (`code`: the tree whose Python runs it); its exit code 3 (not clean: the
    user is there) is an answer too."""
    env = {**os.environ, **_env(home, provider, None), **({"PYTHONPATH": str(code)} if code else {})}
    began = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "sessionctl"), "forget", "--verify", *full, "--user", user,
                           "--json"], capture_output=True, text=True, env=env, timeout=1800)
    seconds = round(time.monotonic() - began, 3)
    if done.returncode not in (0, 3):
        raise SystemExit(f"forget --verify {user} failed: {done.stderr.strip()[-2000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": seconds, "clean": answer["clean"], "files_read": answer["files_read"],
            "files_skipped": answer["files_skipped"], "live_state_asked": answer["live_state_asked"]}


def _bytes_under(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def measure_verify(args: argparse.Namespace) -> int:
    """forget --verify, full and indexed, at the built size and `--grow` times it (see the module docstring)."""
    home, config = state_home("verify-bench-", args.provider, args.users)
    sizes = []
    for size in (1, args.grow):
        if size > 1:  # other users' events, ingested: more files in every table, landing and the state
            spark = get_spark(config)
            build_state(config, args.users * size, spark, start=args.users)
            stop_spark(spark)
        load = [os.getloadavg()[0]]
        runs = {"full, open user": _verify(home, args.provider, "u0000007", "--full"),
                "indexed, first (builds the index)": _verify(home, args.provider, "u0000007"),
                "indexed, open user": _verify(home, args.provider, "u0000011")}
        forgotten = f"u{size * 13:07d}"  # an open user, forgotten now: the workflow is forget, then verify
        seconds, _ = _sessionctl(home, args.provider, "forget", "--user", forgotten, "--json")
        runs["forget"] = {"seconds": seconds}
        runs["indexed, forgotten user, first after the forget"] = _verify(home, args.provider, forgotten)
        runs["indexed, forgotten user"] = _verify(home, args.provider, forgotten)
        runs["full, forgotten user"] = _verify(home, args.provider, forgotten, "--full")
        load.append(os.getloadavg()[0])
        index = home / "audit-index"
        sizes.append({"open_users": args.users * size, "home_bytes": _bytes_under(home) - _bytes_under(index),
                      "index_bytes": _bytes_under(index), "runs": runs, "loadavg_1m": load})
        print(json.dumps(sizes[-1]))
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "provider": args.provider,
           "sizes": sizes}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"verify-{args.provider}-{args.users}.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


def measure_verify_ab(args: argparse.Namespace) -> int:
    """The first verify after a forget, REV's build against this tree's, alternating (see the module docstring)."""
    baseline = baseline_tree(args.baseline, Path(tempfile.mkdtemp(prefix="verify-baseline-")))
    builds = {f"revision {args.baseline}": baseline, "this tree": None}
    homes = {name: state_home("verify-ab-", args.provider, args.users)[0] for name in builds}
    runs: dict[str, dict[str, list]] = {name: {"first indexed": [], "forget": [], "verify after the forget": [],
                                               "again": []} for name in builds}
    for name, code in builds.items():
        runs[name]["first indexed"].append(_verify(homes[name], args.provider, "u0000007", code=code))
    load = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for name, code in builds.items():
            forgotten = f"u{args.users // 2 + round_:07d}"  # the same user in both homes
            seconds, _ = _sessionctl(homes[name], args.provider, "forget", "--user", forgotten, "--json", code=code)
            runs[name]["forget"].append(seconds)
            runs[name]["verify after the forget"].append(_verify(homes[name], args.provider, forgotten, code=code))
            runs[name]["again"].append(_verify(homes[name], args.provider, forgotten, code=code))
            load.append(os.getloadavg()[0])
    after = {name: [run["seconds"] for run in done["verify after the forget"]] for name, done in runs.items()}
    ratios = [round(new / old, 3) for old, new in zip(*after.values())]
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "provider": args.provider,
           "users": args.users, "baseline": args.baseline, "runs": runs, "verify_after_forget_ratio": ratios,
           "loadavg_1m": load}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"verify-ab-{args.provider}-{args.users}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"verify after the forget": after, "ratios": ratios}))
    for home in homes.values():
        shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(baseline.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
