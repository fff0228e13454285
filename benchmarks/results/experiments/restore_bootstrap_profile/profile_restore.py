"""Profile a canonical restore at N open users: its phases and the bootstrap query's progress (README.md here).
Usage: .venv/bin/python benchmarks/results/experiments/restore_bootstrap_profile/profile_restore.py 1000000 rocksdb"""
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from lifecycle import _config, build_state  # noqa: E402
from pyspark.sql.streaming import StreamingQueryListener  # noqa: E402

from pipelines.job.runtime import get_spark, stop_state_stores  # noqa: E402
from state_store.lifecycle import restore, take_savepoint  # noqa: E402


class Progress(StreamingQueryListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def onQueryStarted(self, event) -> None:
        self.events.append(("start", time.time()))

    def onQueryProgress(self, event) -> None:
        self.events.append(("progress", time.time(), json.loads(event.progress.json)))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        self.events.append(("end", time.time()))


def main() -> None:
    users, provider = int(sys.argv[1]), sys.argv[2]
    config = _config(Path(tempfile.mkdtemp(prefix="restore-profile-")) / "home", provider, None)
    spark = get_spark(config)
    build_state(config, users, spark)
    saved = take_savepoint(config, spark=spark, full=True)
    listener = Progress()
    spark.streams.addListener(listener)
    stop_state_stores(spark)
    began = time.time()
    result = restore(config, saved.savepoint_id, spark=spark, canonical=True)
    print("restore", result.seconds, result.phases)
    for event in listener.events:
        if event[0] != "progress":
            print(round(event[1] - began, 2), event[0])
            continue
        p = event[2]
        operators = [(o["numRowsTotal"], o["allUpdatesTimeMs"], o["allRemovalsTimeMs"], o["commitTimeMs"],
                      o.get("customMetrics", {})) for o in p["stateOperators"]]
        print(round(event[1] - began, 2), "batch", p["batchId"], "rows", p["numInputRows"], p["durationMs"], operators)


if __name__ == "__main__":
    main()
