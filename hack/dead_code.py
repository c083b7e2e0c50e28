"""Fails on dead code in the product packages (vulture at 60% confidence).

The tests are scanned too, so code only the tests call counts as used; what vulture reports
inside the tests themselves (pytest hooks, hypothesis rules) is not reported. Names only a
framework calls are listed in ``hack/vulture_whitelist.py``.
"""

from __future__ import annotations

import subprocess
import sys

PATHS = ["app", "coscheduling", "testbed", "benchmarks", "tests", "hack/vulture_whitelist.py"]


def main() -> int:
    run = subprocess.run([sys.executable, "-m", "vulture", *PATHS, "--min-confidence", "60"],
                         capture_output=True, text=True, check=False)
    if run.returncode not in (0, 3):  # 3: vulture found dead code
        print(run.stdout + run.stderr, file=sys.stderr)
        return run.returncode
    found = [line for line in run.stdout.splitlines() if not line.startswith("tests/")]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
