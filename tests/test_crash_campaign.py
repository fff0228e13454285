"""A short seeded crash campaign (benchmarks/crash_campaign.py; the long one has 100+ kill points): commands
SIGKILLed at random moments across catch-up, savepoint, restore, rescale and compact, the operator's recovery, a
final catch-up -- no session lost, none written twice, both providers."""
from __future__ import annotations

import pytest

from tests.campaign import run_campaign


@pytest.mark.parametrize("provider,seed", [("rocksdb", 3), ("hdfs", 4)])
def test_short_crash_campaign(tmp_path, provider, seed):
    report = run_campaign(tmp_path, provider, seed, kill_points=5)
    assert sum(report["by_phase"].values()) == 5
    assert (report["lost"], report["duplicated"], report["unexpected"]) == (0, 0, 0), report
    assert report["written"] == report["expected_sessions"] > 0
