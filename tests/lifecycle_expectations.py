"""Moved to testkit/lifecycle_expectations.py (the crash campaign in testkit uses it too); this re-export keeps the
many test modules that import `tests.lifecycle_expectations` working. New code imports testkit.lifecycle_expectations."""
from testkit.lifecycle_expectations import expected_closed_sessions

__all__ = ["expected_closed_sessions"]
