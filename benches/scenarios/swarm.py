"""The swarm scenario (benches/swarm.rs): N nodes pulling one image at once through a
capped registry — ctr pull straight from it (the baseline), tessera lazy reads with P2P
off and on, ctr pull through the agents' mirrors — completion of the last node and the
registry's egress, per N."""
import os

from scenarios.common import mib

# Every row's figures, checked by check_results.py (all positive: a time, ratios, bytes).
ROW_FIELDS = ["method", "nodes", "last_done_seconds", "vs_baseline", "vs_alone",
              "registry_bytes", "egress_vs_image"]

# ../shared/MISSION.md: 20+ agents pulling one image at once through a capped origin:
# origin egress <= 1.2x the image's compressed size, and the last agent done within 1.5x
# the time one agent alone needs.
TARGET_NODES = 20
TARGET_EGRESS = 1.2
TARGET_ALONE = 1.5
# The methods that share through peers, which the target is about.
P2P_METHODS = ["tessera lazy read, P2P", "ctr pull through the tessera mirror, P2P"]


def methods(r):
    """Method labels in the order the benchmark ran them (the baseline first)."""
    seen = []
    for row in r["rows"]:
        if row["method"] not in seen:
            seen.append(row["method"])
    return seen


def cell(r, method, nodes):
    return next((row for row in r["rows"]
                 if row["method"] == method and row["nodes"] == nodes), None)


def check(r):
    problems = []
    if r.get("baseline") not in methods(r):
        problems.append(f"baseline {r.get('baseline')!r} has no rows")
    for method in methods(r):
        for n in r.get("nodes", []):
            if cell(r, method, n) is None:
                problems.append(f"no row for {method!r} at {n} node(s)")
    if 1 not in r.get("nodes", []):
        problems.append("no one-node run, which vs_alone is measured against")
    return problems


def table(r, header, figure):
    ms = methods(r)
    lines = [f"| nodes | {' | '.join(header(m) for m in ms)} |",
             "|---:|" + "---:|" * len(ms)]
    for n in r["nodes"]:
        lines.append(f"| {n} | " + " | ".join(figure(cell(r, m, n)) for m in ms) + " |")
    return lines


def verdict(r):
    """The mission's swarm target, at the largest N measured."""
    top = max(r["nodes"])
    lines = []
    for method in P2P_METHODS:
        row = cell(r, method, top)
        if row is None:
            continue
        met = row["egress_vs_image"] <= TARGET_EGRESS and row["vs_alone"] <= TARGET_ALONE
        # A smaller swarm (the smoke run) cannot show what 20 nodes do.
        judged = ("met" if met else "**missed**") if top >= TARGET_NODES else \
            f"not judged (only {top} nodes measured)"
        lines.append(
            f"- {method}: {judged}: the registry sent "
            f"{row['egress_vs_image']:.2f}x the image (target <= {TARGET_EGRESS}x) and the last "
            f"of {top} nodes was done in {row['vs_alone']:.2f}x one node's time "
            f"(target <= {TARGET_ALONE}x).")
    return lines


def meaning(r):
    top = max(r["nodes"])
    base, p2p = cell(r, r["baseline"], top), cell(r, "tessera lazy read, P2P", top)
    off = cell(r, "tessera lazy read, P2P off", top)
    if not (base and p2p and off):
        return []
    return [
        f"At {top} nodes plain pulls make the registry send the image {base['egress_vs_image']:.1f} "
        f"times and wait on its link ({base['last_done_seconds']:.1f} s, "
        f"{base['vs_alone']:.1f}x one node's time); Tessera without P2P does the same "
        f"({off['egress_vs_image']:.1f}x the image, {off['last_done_seconds']:.1f} s). With P2P "
        f"the registry sends {p2p['egress_vs_image']:.2f}x the image and the last node is done "
        f"in {p2p['last_done_seconds']:.1f} s, {p2p['vs_baseline']:.1f}x faster than ctr pull."]


def plot(r, plot_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for method in methods(r):
        rows = sorted((row for row in r["rows"] if row["method"] == method),
                      key=lambda row: row["nodes"])
        ax.plot([row["nodes"] for row in rows], [row["last_done_seconds"] for row in rows],
                marker="o", label=method)
    ax.set_xlabel("nodes pulling at once")
    ax.set_ylabel("last node done (s)")
    ax.set_xticks(r["nodes"])
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Swarm: {mib(r['plain_image_bytes'])} image, registry at {r['registry_cap']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    os.makedirs(plot_dir, exist_ok=True)
    fig.savefig(os.path.join(plot_dir, "swarm.png"))
    plt.close(fig)


def render(r, plot_dir=None):
    short = {
        "ctr pull, straight from the registry": "ctr pull (baseline)",
        "tessera lazy read, P2P off": "tessera, P2P off",
        "tessera lazy read, P2P": "tessera, P2P",
        "ctr pull through the tessera mirror, P2P": "ctr pull via mirror, P2P",
    }
    header = lambda m: short.get(m, m)
    lines = [
        "## Swarm: many nodes pulling one image at once",
        "",
        f"Image: {r['files']} files of random bytes in {r['layers']} layers, "
        f"{mib(r['plain_image_bytes'])} as a plain OCI image, {mib(r['image_bytes'])} converted; "
        f"registry egress capped at {r['registry_cap']}; every node a network namespace, every "
        f"run cold; median of {r['repetitions']}. Tessera reads every file through a lazy mount; "
        f"ctr pulls and unpacks.",
        "",
        "Last node done, seconds (vs the baseline at the same N: above 1 is faster):",
        "",
    ]
    lines += table(r, header, lambda c: f"{c['last_done_seconds']:.2f} ({c['vs_baseline']:.2f}x)")
    lines += ["", "Registry egress (its multiple of the image's size):", ""]
    lines += table(r, header, lambda c: f"{mib(c['registry_bytes'])} ({c['egress_vs_image']:.2f}x)")
    lines += [""] + meaning(r)
    lines += ["", "Against the mission's swarm target (20+ nodes: registry egress <= 1.2x the "
                  "image, last node within 1.5x one node's time):", ""] + verdict(r)
    if plot_dir:
        plot(r, plot_dir)
        lines += ["", "![Swarm: last node done vs nodes, per method](swarm.png)"]
    return lines
