"""A seeded crash campaign (the campaign itself: testkit/campaign.py): `sessionctl` commands SIGKILLed at random
moments -- on the stopped job and beside a running stream (online savepoints, stop --savepoint) -- then the operator's
recovery and a final catch-up, compared with the oracle: lost and duplicated sessions must be 0.

    .venv/bin/python benchmarks/crash_campaign.py --kill-points 100 --seed 7     # both providers, ~45 min
    .venv/bin/python benchmarks/crash_campaign.py --kill-points 10               # a short one
    .venv/bin/python benchmarks/crash_campaign.py --named-kills                  # the named kill points only

Writes benchmarks/results/crash_campaign.{json,md}: kill points by phase (killed while running / finished before the
kill), lost and duplicated sessions per provider. `tests/test_crash_campaign.py` runs a short seeded one in make test.
With --named-kills: the named kill points of pipelines/coordination/__init__.py (a savepoint between its task files and its
Delta commit, and between that commit and its catalog row, inside an incremental chain; a chain fold before and after
its commit), each once per provider, in benchmarks/results/crash_campaign_kill_points.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testkit.campaign import run_campaign, run_kill_points  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kill-points", type=int, default=100, help="per provider")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--providers", default="rocksdb,hdfs")
    parser.add_argument("--work-dir", default="/tmp/crash-campaign")
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    parser.add_argument("--named-kills", action="store_true", help="the named kill points only (see above)")
    args = parser.parse_args()
    if args.named_kills:
        named = [run_kill_points(Path(args.work_dir), provider, args.seed) for provider in args.providers.split(",")]
        write_named(named, Path(args.results_dir))
        print(json.dumps(named, default=dict))
        return
    reports = [run_campaign(Path(args.work_dir), provider, args.seed, args.kill_points)
               for provider in args.providers.split(",")]
    write_results(reports, Path(args.results_dir))
    print(json.dumps(reports, default=dict))


def _save(out: Path, name: str, reports: list[dict], lines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(reports, indent=2, default=dict))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def write_results(reports: list[dict], out: Path) -> None:
    lines = ["# Crash campaign", "", "| provider | seed | kill points | by phase | operator's recoveries | lost | "
             "duplicated | unexpected | minutes |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['provider']} | {r['seed']} | {r['kill_points']} | {r['by_phase']} | {dict(r['recoveries'])} | "
              f"{r['lost']} | {r['duplicated']} | {r['unexpected']} | {r['minutes']} |" for r in reports]
    _save(out, "crash_campaign", reports, lines)


def write_named(reports: list[dict], out: Path) -> None:
    lines = ["# Crash campaign: named kill points", "", "| provider | kill point | killed there | complete savepoints "
             "unchanged | chains whole | newest restorable (pre-flight) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['provider']} | {o['point']} | {o['killed']} | {o['complete_unchanged']} | {o['chains_whole']} | "
              f"{o['restorable']} |" for r in reports for o in r["kill_points"]]
    lines += ["", "| provider | killed right after taking its lease | killed there | the next catch-up's exit |",
              "|---|---|---|---|"]
    lines += [f"| {r['provider']} | {k['command']} ({k['point']}) | {k['killed']} | {k['next_command_exit']} |"
              for r in reports for k in r.get("lease_kills", [])]
    lines += ["", "| provider | folded by the compaction after the kills | savepoints at the end | lost | duplicated | "
              "unexpected | minutes | load (1 min, end) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['provider']} | {r['compact_after_kills_folded']} | {r['kinds_at_end']} | {r['lost']} | "
              f"{r['duplicated']} | {r['unexpected']} | {r['minutes']} | {r['load_avg_1m_end']} |" for r in reports]
    _save(out, "crash_campaign_kill_points", reports, lines)


if __name__ == "__main__":
    main()
