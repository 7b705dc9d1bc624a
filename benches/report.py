#!/usr/bin/env python3
"""Renders a benchmark run's results as Markdown: the machine, the exact command, then a
table per scenario, from the JSON files in a results directory (one per scenario, as the
benchmarks write them with TESSERA_BENCH_JSON, plus machine.json).

    benches/report.py RESULTS_DIR [--out FILE]     (default: stdout)

Used by `make bench-suite` (RESULTS.md) and `make bench-smoke` (so it cannot rot)."""
import argparse
import json
import os
import platform
import subprocess
import sys


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
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cores": cores,
        "cpu": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "commit": commit,
    }


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def lazy_start(r):
    lines = [
        "## Lazy start: time to a started application on a cold node",
        "",
        f"Image: {r.get('image') or 'the benchmark image'}, "
        f"{mib(r['image_unpacked_bytes'])} unpacked; registry egress capped at "
        f"{r['registry_cap']}; median of {r['repetitions']} cold repetitions; the start-up "
        f"reads {r['startup_files']} files.",
        "",
        "| method | fetch / mount s | start-up s | total s | vs skopeo+umoci | registry sent |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['method']} | {row['fetch_seconds']:.2f} | {row['start_seconds']:.2f} | "
            f"{row['total_seconds']:.2f} | {row['vs_baseline']:.2f}x | {mib(row['registry_bytes'])} |")
    lines += ["", "Ratio: the baseline's total / this total (above 1: faster than skopeo + umoci)."]
    # ../shared/MISSION.md: a lazy start about 20x faster than a full pull (0.5x Nydus's
    # 3.9 s, 3.2 s with a prefetch list, fetching 54-64 MB, on a similar image and link).
    lazy = [row for row in r["rows"] if row["method"].startswith("tessera")]
    if lazy:
        best = max(row["vs_baseline"] for row in lazy)
        verdict = "met" if best >= 20 else "**missed**"
        figures = "; ".join(f"{row['method']} {row['vs_baseline']:.2f}x, "
                            f"{mib(row['registry_bytes'])} fetched" for row in lazy)
        lines += ["", f"Against the mission's target (about 20x faster than a full pull, "
                      f"fetching about what the start-up reads): {verdict}: {figures}."]
    return lines


RENDERERS = {"lazy_start": lazy_start}


def render(results_dir):
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
        renderer = RENDERERS.get(result.get("scenario"))
        if renderer is None:
            sys.exit(f"{name}: no renderer for scenario {result.get('scenario')!r}")
        out += renderer(result) + [""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir")
    parser.add_argument("--out")
    parser.add_argument("--write-machine", metavar="COMMAND",
                        help="record this machine and COMMAND in RESULTS_DIR/machine.json and exit")
    args = parser.parse_args()
    if args.write_machine:
        m = machine()
        m["command"] = args.write_machine
        os.makedirs(args.results_dir, exist_ok=True)
        json.dump(m, open(os.path.join(args.results_dir, "machine.json"), "w"), indent=2)
        return
    text = render(args.results_dir)
    if args.out:
        open(args.out, "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
