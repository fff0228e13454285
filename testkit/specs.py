"""Session specs the tests and benchmarks share: the contract's example, word for word (../shared/CONTRACT.md,
"Session spec"), as the text a user would write in their SESSIONS_SPEC file."""
from __future__ import annotations

__all__ = ["CONTRACT_EXAMPLE"]

CONTRACT_EXAMPLE = """\
input:                                   # where each field is in an incoming JSON object
  event_id: messageId                    # a dotted path
  user_id: [userId, anonymousId]         # a list: the first that is present and not null
  event_time: {path: timestamp, format: iso8601}     # iso8601 | epoch_s | epoch_ms | epoch_us
  event_type: event                      # `logout` still closes a session
  fields:                                # extra fields the attributes use: path and type (string|long|double|boolean)
    page: {path: properties.url, type: string}
    referrer: {path: context.page.referrer, type: string}
    revenue: {path: properties.revenue, type: double}
attributes:                              # extra columns of `sessions`, over the session's events
  landing_page: {first: page}
  exit_page: {last: page}
  referrer: {first: referrer}
  purchases: {count_if: {event_type: [purchase, order_completed]}}
  revenue: {sum: revenue}
  top_order: {max: revenue}
"""
