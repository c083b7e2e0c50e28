"""Lockstep's edge: HTTP routes and Kubernetes adapters around the pure core."""

import time as _time

STARTED = _time.monotonic()
"""When the process imported ``app`` (the first thing ``python -m app`` does)."""
