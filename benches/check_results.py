#!/usr/bin/env python3
"""Checks a benchmark's JSON results for shape and sense (never for speed): every
scenario names itself, every row has its figures, and they are positive numbers.
Used by `make bench-smoke`; exits non-zero naming what is wrong."""
import importlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def check(path):
    problems = []
    with open(path) as f:
        result = json.load(f)
    scenario = result.get("scenario")
    try:
        module = importlib.import_module(f"scenarios.{scenario}")
    except (ModuleNotFoundError, TypeError, ValueError):
        return [f"{path}: unknown scenario {scenario!r} (no benches/scenarios/{scenario}.py)"]
    rows = result.get("rows") or []
    if len(rows) < 2:
        problems.append(f"{path}: {len(rows)} rows; a baseline and at least one method expected")
    for i, row in enumerate(rows):
        for key in module.ROW_FIELDS:
            if key not in row:
                problems.append(f"{path}: row {i} has no {key}")
            elif key != "method" and not (isinstance(row[key], (int, float))
                                          and math.isfinite(row[key]) and row[key] > 0):
                problems.append(f"{path}: row {i} {key} = {row[key]!r}, not a positive number")
    if hasattr(module, "check"):
        problems += [f"{path}: {p}" for p in module.check(result)]
    return problems


def main():
    # machine.json (what report.py records of the machine) is not a scenario.
    paths = [p for p in sys.argv[1:] if not p.endswith("machine.json")]
    problems = [p for path in paths for p in check(path)]
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        sys.exit(1)
    if not paths:
        sys.exit("no benchmark results given")
    print(f"benchmark results look sound: {', '.join(paths)}")


if __name__ == "__main__":
    main()
