"""``make bench``: run every benchmark, print readable tables, write JSON.

``python -m benchmarks [verbs] [placement] [--quick]``; results go to bench-results/.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from . import placement, verbs


def table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    heads = [h for _, h in columns]
    cells = [[str(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("which", nargs="*", default=["verbs", "placement"])
    ap.add_argument("--quick", action="store_true", help="fewer requests and sizes")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "machine": platform.machine()}
    if "verbs" in args.which:
        rows = verbs.run(requests=100 if args.quick else 300,
                         sizes=(500, 5000) if args.quick else verbs.SIZES)
        (out / "verbs.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
        print("\nVerb latency (ms, client round trip; goal: filter p99 < 5 ms at 5,000 nodes "
              "and within 2x of no-op)")
        print(table(rows, verbs.TABLE_COLUMNS))
    if "placement" in args.which:
        result = placement.run(quick=args.quick)
        (out / "placement.json").write_text(json.dumps({**meta, **result}, indent=2))
        print("\nPlacement quality (stock kube-scheduler vs Lockstep, same seeded workload)")
        print(table(result["rows"], placement.TABLE_COLUMNS))
    print(f"\nJSON written to {out}/")


if __name__ == "__main__":
    main()
