"""The tests of the benchmarks' own logic (their reports): the benchmark under test is imported from
`bench/`. Only tests here do that (`tests/unit/test_layers.py`); test support lives in `tests/support`."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
