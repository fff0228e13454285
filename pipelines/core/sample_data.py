"""Realistic sample clickstream for the demo and the benchmark: users browse in bursts, some log out,
events arrive a little out of order, a few are duplicated, a few lines are broken."""
from __future__ import annotations

import datetime as dt
import json
import os
import random
from pathlib import Path
from typing import Any

__all__ = ["PAGES", "TYPES", "arrival_order", "generate_events", "land", "land_sample"]

PAGES = ["/", "/search", "/product/1", "/product/2", "/product/3", "/cart", "/checkout", "/help"]
TYPES = ["page_view"] * 8 + ["click"] * 3 + ["add_to_cart", "search"]


def generate_events(users: int, sessions_per_user: int, seed: int = 7,
                    start: dt.datetime = dt.datetime(2026, 11, 1, 8, tzinfo=dt.timezone.utc),
                    gap_minutes: int = 30) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    events = []
    n = 0
    for u in range(users):
        user = f"user-{u:06d}"
        t = start + dt.timedelta(seconds=rng.randint(0, 3600))
        for _ in range(sessions_per_user):
            for _event in range(rng.randint(1, 12)):
                t += dt.timedelta(seconds=rng.randint(5, 300))
                n += 1
                events.append({"event_id": f"e-{n:09d}", "user_id": user, "event_time": t.isoformat().replace("+00:00", "Z"),
                               "event_type": rng.choice(TYPES), "page": rng.choice(PAGES)})
            if rng.random() < 0.3:
                t += dt.timedelta(seconds=rng.randint(1, 60))
                n += 1
                events.append({"event_id": f"e-{n:09d}", "user_id": user, "event_time": t.isoformat().replace("+00:00", "Z"),
                               "event_type": "logout", "page": None})  # type: ignore[dict-item]
            t += dt.timedelta(minutes=gap_minutes + rng.randint(1, 120))
    return events


def arrival_order(events: list[dict[str, Any]], seed: int = 7, jitter_seconds: int = 120,
                  duplicate_rate: float = 0.01) -> list[dict[str, Any]]:
    """Sort by event time plus a random delay: bounded disorder, like a real collector."""
    rng = random.Random(seed + 1)
    keyed = []
    for e in events:
        at = dt.datetime.fromisoformat(e["event_time"]).timestamp() + rng.uniform(0, jitter_seconds)
        keyed.append((at, e))
        if rng.random() < duplicate_rate:
            keyed.append((at + rng.uniform(0, jitter_seconds), e))
    keyed.sort(key=lambda pair: pair[0])
    return [e for _, e in keyed]


def land(landing: Path, name: str, lines: list[str]) -> Path:
    """Write elsewhere and rename in, so the job never sees a half-written file (the contract)."""
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".{name}.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    target = landing / name
    os.replace(tmp, target)
    return target


def land_sample(landing: Path, users: int = 500, sessions_per_user: int = 4, files: int = 8, seed: int = 7) -> dict[str, int]:
    events = arrival_order(generate_events(users, sessions_per_user, seed), seed)
    lines = [json.dumps(e) for e in events]
    broken = ['{"event_id": "bad-1", "user_id": "user-000001", "event_time": ', '{"user_id": "user-000002", "event_time": "2026-11-01T09:00:00Z"}',
              '{"event_id": "bad-3", "user_id": "user-000003", "event_time": "yesterday"}']
    per_file = -(-len(lines) // files)
    for i in range(files):
        chunk = lines[i * per_file:(i + 1) * per_file]
        if i == files // 2:
            chunk = chunk + broken
        land(landing, f"clicks-{i:04d}.jsonl", chunk)
    return {"events": len(events), "files": files, "broken_lines": len(broken)}
