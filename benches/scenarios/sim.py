"""The swarm simulation (benches/sim.rs): the scheduler's real decision code driven by
a discrete-event model of N agents and an origin. One row per simulated set-up and N:
completion percentiles, origin egress, the real find_peers/announce calls' cost."""
from scenarios.common import mib

# Every row's figures, checked by check_results.py.
ROW_FIELDS = ["method", "nodes", "image_bytes", "chunk_bytes", "p50_s", "p99_s", "p999_s",
              "last_s", "origin_bytes", "egress_vs_image", "decide_p50_ns", "decide_p99_ns",
              "announce_p50_ns", "announce_p99_ns", "events", "wall_s"]

# Issue 24: at 2,600 hosts in Kraken's set-up, p99 below Kraken's published 18 s; the
# model within 25% of the real 20-namespace run.
KRAKEN_HOSTS = 2600
VALIDATION_BAR = 0.25


def check(r):
    problems = []
    methods = {row["method"] for row in r.get("rows", [])}
    for m in ("testbed", "common", "kraken"):
        if m not in methods:
            problems.append(f"no {m} row")
    if not r.get("validation"):
        problems.append("no validation against the real run")
    if not (r.get("kraken") or {}).get("published"):
        problems.append("no Kraken figures")
    return problems


def secs(v):
    return f"{v:.2f} s"


def ns(v):
    return f"{v / 1000:.1f} µs" if v >= 10_000 else f"{v:.0f} ns"


def render(r, plot_dir=None):
    cpu = r["cpu"]
    lines = [
        "## Simulation: the scheduler's decisions past this machine",
        "",
        "The real `tessera_scheduler::swarm::Swarm` driven by a discrete-event model of N "
        "agents behaving like the agent's fetch path (benches/README.md, \"Simulation\"). "
        f"Testbed CPU capacity {cpu['bps'] / 1e6:.0f} MB/s machine-wide, calibrated on "
        f"{cpu['source']} (machine CPU-seconds per byte received); the other node counts "
        "are predictions.",
        "",
        "| set-up | nodes | image | chunk | p50 | p99 | p99.9 | last | origin egress | "
        "find_peers p50 / p99 | announce p50 / p99 | events | wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['method']} | {row['nodes']:,} | {mib(row['image_bytes'])} | "
            f"{row['chunk_bytes'] >> 10} KiB | {secs(row['p50_s'])} | {secs(row['p99_s'])} | "
            f"{secs(row['p999_s'])} | {secs(row['last_s'])} | {mib(row['origin_bytes'])} "
            f"({row['egress_vs_image']:.2f}x) | {ns(row['decide_p50_ns'])} / "
            f"{ns(row['decide_p99_ns'])} | {ns(row['announce_p50_ns'])} / "
            f"{ns(row['announce_p99_ns'])} | {row['events']:,} | {row['wall_s']:.1f} s |")
    k = r["kraken"]
    pub, ours = k["published"], k["ours"]
    hosts = max((row["nodes"] for row in r["rows"] if row["method"] == "kraken"), default=0)
    lines += [
        "",
        f"Kraken's published set-up ({hosts:,} hosts; uber/kraken README):",
        "",
        "| | p50 | p99 | p99.9 |",
        "|---|---:|---:|---:|",
        f"| Kraken (published) | {secs(pub['p50_s'])} | {secs(pub['p99_s'])} | {secs(pub['p999_s'])} |",
        f"| tessera (simulated) | {secs(ours['p50_s'])} | {secs(ours['p99_s'])} | {secs(ours['p999_s'])} |",
        "",
        f"Validation against the real swarm benchmark ({r['real_source']}):",
        "",
        "| nodes | role | model: last done | real: last done | error |",
        "|---:|---|---:|---:|---:|",
    ]
    for v in r["validation"]:
        lines.append(f"| {v['nodes']} | {v.get('role', 'prediction')} | {secs(v['model_s'])} | "
                     f"{secs(v['real_s'])} | {v['error'] * 100:+.0f}% |")
    lines.append("")
    if hosts >= KRAKEN_HOSTS:
        met = ours["p99_s"] < pub["p99_s"]
        lines.append(f"- Kraken's set-up: {'met' if met else '**missed**'}: p99 "
                     f"{secs(ours['p99_s'])} (target below {secs(pub['p99_s'])}).")
    else:
        lines.append(f"- Kraken's set-up: not judged (only {hosts} hosts simulated).")
    predicted = [v for v in r["validation"] if v.get("role", "prediction") == "prediction"]
    worst = max((abs(v["error"]) for v in predicted), default=float("inf"))
    judged = "met" if worst <= VALIDATION_BAR else "**missed**"
    if r.get("small"):
        judged = "not judged (smoke size: a smaller image than the real run's)"
    lines.append(f"- Model vs the real run: {judged}: worst error of a prediction {worst * 100:.0f}% "
                 f"(bar: within {VALIDATION_BAR * 100:.0f}%).")
    return lines
