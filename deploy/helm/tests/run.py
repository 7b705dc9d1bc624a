"""Runs every chart test (test_*.py beside this file) and closes with one line,
"chart: N passed, N failed". A skipped test counts as a failure: every test here must
be able to run wherever `make test` runs."""

import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

suite = unittest.defaultTestLoader.discover(str(HERE), top_level_dir=str(HERE))
result = unittest.TextTestRunner(verbosity=2).run(suite)
bad = {id(test) for test, _ in result.failures + result.errors + result.skipped}
bad |= {id(test) for test in result.unexpectedSuccesses}
passed = max(result.testsRun - len(bad), 0)
print(f"chart: {passed} passed, {len(bad)} failed")
sys.exit(0 if result.testsRun > 0 and not bad else 1)
