"""A read-only home (a backup mounted read-only, a replica's snapshot): the commands that only read answer from it --
`status` and `state --top` with their Spark pass over the state, `forget --verify` -- and what needs a write the home
cannot take is one line naming SESSIONS_HOME, never a traceback. `forget --verify` exits 3 when the user still
appears (its JSON on stdout all the same). The commands that start no JVM: tests/test_one_line_errors.py."""
from __future__ import annotations

import json

import pytest

from pipelines.core.sample_data import land_sample
from pipelines.ingest.erased import user_hash
from pipelines.job.stream import catch_up
from tests.kit.homes import make_config
from tests.test_one_line_errors import _env, _sessionctl, read_only

pytestmark = pytest.mark.tier("subprocess")


def test_reads_work_on_a_read_only_home(tmp_path, spark):
    config = make_config(tmp_path)
    land_sample(config.landing, users=10, sessions_per_user=2, files=1)
    catch_up(config, spark)
    home = config.home
    env = _env(home, SESSIONS_STATE_PARTITIONS="2")
    with read_only(home) as prefix:
        status = _sessionctl(env, "status", "--json", prefix=prefix, cwd=tmp_path)
        assert status.returncode == 0, status.stderr[-3000:]
        report = json.loads(status.stdout)
        assert report["last_committed_batch"] is not None and report["open_users"] > 0
        top = _sessionctl(env, "state", "--top", "1", "--json", prefix=prefix, cwd=tmp_path)
        assert top.returncode == 0 and len(json.loads(top.stdout)["top"]) == 1, top.stderr[-3000:]
        # The erasure key is made on first use: a home that cannot take it says so in one line.
        keyless = _sessionctl(env, "forget", "--verify", "--user", "user-000001", prefix=prefix, cwd=tmp_path)
        assert keyless.returncode == 1 and keyless.stdout == "", keyless.stderr[-3000:]
        [line] = keyless.stderr.splitlines()
        assert line.startswith(f"sessionctl forget: SESSIONS_HOME {home} is not writable (") and \
            "`sessionctl forget --verify` needs to write " in line and "erasure.key" in line
    user_hash(config, "user-000001")  # the key, as an earlier forget on the writable home made it
    with read_only(home) as prefix:
        found = _sessionctl(env, "forget", "--verify", "--user", "user-000001", "--json", prefix=prefix, cwd=tmp_path)
    assert found.returncode == 3, found.stderr[-3000:]  # not clean: 3, the answer on stdout
    answer = json.loads(found.stdout)
    assert answer["clean"] is False and answer["found"]["raw_events"] > 0
    [line] = found.stderr.splitlines()
    assert line.startswith("sessionctl forget: the user still appears in raw_events (") and "user-000001" not in line
