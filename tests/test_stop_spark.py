"""pipelines.job.runtime.stop_spark at the end of a process that used Spark: the context stops, the accumulator server is
shut down without the process waiting on its poll, and a new session in the same process works (a process boundary
is the point: the shared test session cannot be stopped)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.kit.homes import config_env, make_config

pytestmark = pytest.mark.tier("subprocess")

_SCRIPT = """
import threading
from pipelines.config import SessionsConfig
from pipelines.job.runtime import get_spark, stop_spark

def summed(spark):  # an accumulator fed by tasks: its updates reach the driver through the accumulator server
    total = spark.sparkContext.accumulator(0)
    spark.sparkContext.parallelize(range(100), 4).foreach(lambda x: total.add(x))
    return total.value

config = SessionsConfig.from_env()
spark = get_spark(config)
assert summed(spark) == 4950, summed(spark)
context = spark.sparkContext
server = context._accumulatorServer
stop_spark(spark)
assert context._jsc is None, "the context was not stopped"
assert context._accumulatorServer is None
for shutdown in [t for t in threading.enumerate() if t.name == "accumulator-server-shutdown"]:
    shutdown.join(timeout=5)  # the background shutdown closes the socket (pyspark's AccumulatorServer.shutdown)
assert server.socket.fileno() == -1, "the accumulator server was never shut down"
again = get_spark(config)
assert summed(again) == 4950
stop_spark(again)
print("ok")
"""


def test_stop_spark_shuts_the_accumulator_server_down_and_a_new_session_works(tmp_path):
    config = make_config(tmp_path)
    config.home.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=config_env(config), capture_output=True, text=True,
                          timeout=300, cwd=config.home)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok"
