"""Helpers shared by the test modules (tests/ is on sys.path under pytest)."""

from attn.train import METRIC_TIMING_KEYS


def without_timing(records: list[dict]) -> list[dict]:
    """Metric records minus the fields that vary run to run (wall time, speed)."""
    return [{k: v for k, v in r.items() if k not in METRIC_TIMING_KEYS} for r in records]
