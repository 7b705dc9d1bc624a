#!/usr/bin/env python3
"""Renders a benchmark run's results as Markdown: the machine, the exact command, then a
table per scenario, from the JSON files in a results directory (one per scenario, as the
benchmarks write them with TESSERA_BENCH_JSON, plus machine.json).

    benches/report.py RESULTS_DIR [--out FILE] [--plots DIR]     (default: stdout, no plots)

Each scenario is a module of benches/scenarios/ named by the JSON's "scenario": it
renders its result as Markdown lines and, given a plot directory, may draw PNGs there.

Used by `make bench-suite` (RESULTS.md) and `make bench-smoke` (so it cannot rot)."""
import argparse
import importlib
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def machine():
    """What the figures were measured on."""
    cores = os.cpu_count()
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "describe", "--always"], capture_output=True,
                                text=True, check=True).stdout.strip()
        # The report's own outputs (this file's previous run) do not make the code dirty.
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":!benches/RESULTS.md", ":!benches/*.png"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        if changed:
            commit += "-dirty"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cores": cores,
        "cpu": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "commit": commit,
    }


def scenario_module(scenario, where):
    """benches/scenarios/<scenario>.py: its ROW_FIELDS, render() and optional check()."""
    if not isinstance(scenario, str) or not scenario.isidentifier():
        sys.exit(f"{where}: no scenario name (\"scenario\": ...)")
    try:
        return importlib.import_module(f"scenarios.{scenario}")
    except ModuleNotFoundError:
        sys.exit(f"{where}: unknown scenario {scenario!r} (no benches/scenarios/{scenario}.py)")


def render(results_dir, plot_dir=None):
    machine_file = os.path.join(results_dir, "machine.json")
    m = json.load(open(machine_file)) if os.path.exists(machine_file) else machine()
    out = [
        "# Benchmark results",
        "",
        f"- Machine: {m['cores']} cores ({m['cpu'] or 'unknown CPU'}), {m['memory_gib']} GiB, "
        f"Linux {m['kernel']}",
        f"- Code: commit {m['commit']}",
        f"- Command: `{m.get('command', 'make bench-suite')}`",
        "",
    ]
    scenarios = sorted(f for f in os.listdir(results_dir)
                       if f.endswith(".json") and f != "machine.json")
    if not scenarios:
        sys.exit(f"{results_dir}: no scenario results (*.json) to report")
    for name in scenarios:
        result = json.load(open(os.path.join(results_dir, name)))
        out += scenario_module(result.get("scenario"), name).render(result, plot_dir) + [""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir")
    parser.add_argument("--out")
    parser.add_argument("--plots", metavar="DIR",
                        help="also draw PNG plots into DIR (needs matplotlib)")
    parser.add_argument("--write-machine", metavar="COMMAND",
                        help="record this machine and COMMAND in RESULTS_DIR/machine.json and exit")
    args = parser.parse_args()
    if args.write_machine:
        m = machine()
        m["command"] = args.write_machine
        os.makedirs(args.results_dir, exist_ok=True)
        json.dump(m, open(os.path.join(args.results_dir, "machine.json"), "w"), indent=2)
        return
    text = render(args.results_dir, args.plots)
    if args.out:
        open(args.out, "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
