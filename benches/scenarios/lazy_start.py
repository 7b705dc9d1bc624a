"""The lazy-start scenario (benches/lazy_start.rs): time to a started application on a
cold node, full pull + unpack vs tessera mount."""
from scenarios.common import mib

# Every row's figures, checked by check_results.py.
ROW_FIELDS = ["method", "fetch_seconds", "start_seconds", "total_seconds", "vs_baseline",
              "registry_bytes"]


def render(r, plot_dir=None):
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
    # The Kubernetes path (issue: containerd snapshotter): a CRI pull as the kubelet
    # makes it, then the start-up as a container; overlayfs vs the Tessera snapshotter.
    cri = {row["method"]: row for row in r["rows"] if "CRI pull" in row["method"]}
    base = next((row for name, row in cri.items() if "overlayfs" in name), None)
    if base:
        lines += ["", "Kubernetes path (CRI pull to the container's command done, the "
                      "start-up run in a container by runc): "
                      + "; ".join(f"{name} {row['total_seconds']:.2f} s "
                                  f"({base['total_seconds'] / max(row['total_seconds'], 1e-9):.2f}x "
                                  f"vs overlayfs, {mib(row['registry_bytes'])} from the registry)"
                                  for name, row in cri.items()) + "."]
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
        # Where a lazy start's time goes: waiting on reads vs what the link needs for
        # the bytes sent (the least time any fetcher could take for them).
        profiled = [row for row in lazy if "read_wait_seconds" in row]
        if profiled:
            lines += ["", "| method | start-up s | of which waiting for data s | "
                          "link time for the bytes sent s | bound |", "|---|---:|---:|---:|---|"]
            for row in profiled:
                bound = ("the link (fetch fewer bytes to go faster)"
                         if row["link_seconds"] >= 0.7 * row["start_seconds"]
                         else "round trips (the reader waits on misses one at a time)")
                lines.append(f"| {row['method']} | {row['start_seconds']:.2f} | "
                             f"{row['read_wait_seconds']:.2f} | {row['link_seconds']:.2f} | "
                             f"{bound} |")
            floor = min(row["link_seconds"] for row in profiled)
            base = r["rows"][0]["total_seconds"]
            lines += ["", f"At this link the bytes these start-ups fetch allow at most "
                          f"{base / floor:.1f}x over the baseline, whatever the fetcher does."]
    return lines
