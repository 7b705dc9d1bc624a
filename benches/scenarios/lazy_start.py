"""The lazy-start scenario (benches/lazy_start.rs): time to a started application, full
pull + unpack vs tessera mount (cold, with a prefetch list, over a full local cache,
every chunk on a peer) vs nydusd on the same tree, registry and link; and a tar of the
image's largest trees through each (issue 21); the plain image started through its
index, never converted (issue 22); Podman's own pull of the plain image vs the converted
image through the agent's additional layer store (issue 26)."""
from scenarios.common import mib

# Every row's figures, checked by check_results.py (positive numbers). The registry's
# bytes are checked in check(): a row served from a full local cache may send none.
ROW_FIELDS = ["method", "fetch_seconds", "start_seconds", "total_seconds", "vs_baseline"]

TESSERA_COLD = "tessera mount (cold)"
TESSERA_LIST = "tessera mount + prefetch list"
TESSERA_FULL = "tessera mount, full local cache"
TESSERA_PEER = "tessera mount, every chunk on a peer"
INDEX_ROWS = ["tessera mount, plain image + index (cold)",
              "tessera mount, plain image + index + prefetch list"]
NYDUS_ROWS = ["nydusd (cold)", "nydusd + prefetch list", "nydusd, full local blobcache"]
# The rows that start on a node with nothing: the mission's lazy-start comparison.
COLD_LAZY = [TESSERA_COLD, TESSERA_LIST]
# Each Tessera row measured the same way as a nydusd row carries "vs_nydusd".
NYDUS_PAIRED = [TESSERA_COLD, TESSERA_LIST, TESSERA_FULL]
# Podman (issue 26): its own pull of the plain image, and the converted image through
# the agent's layer store; the latter carries "vs_podman_plain".
PODMAN_PLAIN = "podman pull + run (plain image)"
PODMAN_STORE = "podman pull + run, converted image via the tessera layer store"
TAR_NATIVE = "tar: native dir"
TAR_TESSERA = "tar: tessera mount, full local cache"
TAR_NYDUS = "tar: nydusd, full local blobcache"


def number(value, positive=False):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value >= 0 and (value > 0 or not positive))


def check(r):
    problems = []
    rows = {row.get("method"): row for row in r.get("rows", [])}
    for name, row in rows.items():
        for key in ("registry_bytes", "origin_requests"):
            if not number(row.get(key)):
                problems.append(f"{name}: {key} = {row.get(key)!r}, not a number >= 0")
    for name in COLD_LAZY + [TESSERA_FULL, TESSERA_PEER]:
        if name not in rows:
            problems.append(f"no row {name!r}")
    peer = rows.get(TESSERA_PEER, {})
    # The row measures nothing if node B did not get its chunks from node A.
    if TESSERA_PEER in rows and not number(peer.get("peer_bytes"), positive=True):
        problems.append(f"{TESSERA_PEER}: peer_bytes = {peer.get('peer_bytes')!r}, nothing from peers")
    problems += check_tar(r)
    problems += check_nydusd(r, rows)
    problems += check_targets(r)
    problems += check_index(r, rows)
    problems += check_podman(rows)
    return problems


def check_podman(rows):
    """Both Podman rows ran (a run without podman fails rather than drop them), and the
    store's row carries its ratio against the plain pull."""
    problems = [f"no row {name!r}" for name in (PODMAN_PLAIN, PODMAN_STORE) if name not in rows]
    if not problems and not number(rows[PODMAN_STORE].get("vs_podman_plain"), positive=True):
        problems.append(f"{PODMAN_STORE}: vs_podman_plain = "
                        f"{rows[PODMAN_STORE].get('vs_podman_plain')!r}")
    return problems


def check_index(r, rows):
    """Issue 22's rows: the plain image started through its index."""
    if not any(name in rows for name in INDEX_ROWS):
        return []
    index = r.get("index") or {}
    return [f"index: {key} = {index.get(key)!r}, not a positive number"
            for key in ("seconds", "gunzip_seconds", "index_bytes", "layer_bytes")
            if not number(index.get(key), positive=True)]


def check_tar(r):
    problems = []
    tar = {row.get("method"): row for row in r.get("tar_rows", [])}
    for name in (TAR_NATIVE, TAR_TESSERA):
        if name not in tar:
            problems.append(f"no tar row {name!r}")
    for name, row in tar.items():
        for key in ("cold_seconds", "warm_seconds", "archive_bytes"):
            if not number(row.get(key), positive=True):
                problems.append(f"{name}: {key} = {row.get(key)!r}, not a positive number")
    if not r.get("tar_trees"):
        problems.append("tar_trees: none named")
    return problems


def check_nydusd(r, rows):
    """nydusd's rows are there, with a ratio on every Tessera row measured the same way,
    or the result says why they are not."""
    nydusd = r.get("nydusd")
    if not isinstance(nydusd, dict):
        return ["nydusd: neither figures nor the reason there are none"]
    if nydusd.get("skipped"):
        return []
    problems = [f"no nydusd row {name!r}" for name in NYDUS_ROWS if name not in rows]
    tar = {row.get("method"): row for row in r.get("tar_rows", [])}
    if TAR_NYDUS not in tar:
        problems.append(f"no tar row {TAR_NYDUS!r}")
    for name in NYDUS_PAIRED:
        if name in rows and not number(rows[name].get("vs_nydusd"), positive=True):
            problems.append(f"{name}: vs_nydusd = {rows[name].get('vs_nydusd')!r}")
    for key in ("vs_nydusd_cold", "vs_nydusd_warm"):
        if not number(tar.get(TAR_TESSERA, {}).get(key), positive=True):
            problems.append(f"{TAR_TESSERA}: {key} missing")
    for name in NYDUS_ROWS:
        backend = rows.get(name, {}).get("nydusd_backend", {})
        if not (number(backend.get("bytes")) and number(backend.get("requests"))):
            problems.append(f"{name}: nydusd_backend = {backend!r}")
    if not number(nydusd.get("blob_bytes"), positive=True):
        problems.append(f"nydusd blob_bytes = {nydusd.get('blob_bytes')!r}")
    return problems


def check_targets(r):
    targets = r.get("targets")
    if not isinstance(targets, list) or not targets:
        return ["targets: none (issue 21's targets and their verdicts)"]
    problems = []
    for t in targets:
        if not (isinstance(t.get("target"), str) and number(t.get("measured"))
                and number(t.get("limit")) and isinstance(t.get("met"), bool)):
            problems.append(f"target {t!r}: target, measured, limit and met expected")
    # The peer row's two targets need no nydusd; nor does the full cache's.
    if sum(TESSERA_PEER in t.get("target", "") for t in targets) < 2:
        problems.append(f"targets: {TESSERA_PEER}'s two are missing")
    return problems


def ratio(row, key):
    return f"{row[key]:.2f}x" if key in row else "–"


def render(r, plot_dir=None):
    nydusd = r.get("nydusd") or {}
    if nydusd.get("skipped"):
        nydus_line = f"nydusd: not run ({nydusd['skipped']})."
    elif nydusd:
        nydus_line = (f"nydusd: nydus-rs {nydusd.get('version')}, `{nydusd.get('image')}`, "
                      f"blob {mib(nydusd.get('blob_bytes', 0))} "
                      f"({mib(nydusd.get('prefetch_blob_bytes', 0))} with the prefetch list).")
    else:
        nydus_line = "nydusd: not in this result."
    lines = [
        "## Lazy start: time to a started application",
        "",
        f"Image: {r.get('image') or 'the benchmark image'}, "
        f"{mib(r['image_unpacked_bytes'])} unpacked; registry egress capped at "
        f"{r['registry_cap']}; median of {r['repetitions']} repetitions; the start-up "
        f"reads {r['startup_files']} files.",
        "",
        nydus_line,
        "",
        "| method | fetch / mount s | start-up s | total s | vs skopeo+umoci | registry sent "
        "| origin requests | from peers | vs nydusd |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        peers = mib(row["peer_bytes"]) if "peer_bytes" in row else "–"
        lines.append(
            f"| {row['method']} | {row['fetch_seconds']:.2f} | {row['start_seconds']:.2f} | "
            f"{row['total_seconds']:.2f} | {row['vs_baseline']:.2f}x | {mib(row['registry_bytes'])} | "
            f"{row.get('origin_requests', 0):.0f} | {peers} | {ratio(row, 'vs_nydusd')} |")
    lines += ["", "Ratios: the other's total / this total (above 1: this row is faster). "
                  "Origin requests: blob GETs in the registry's access log."]
    lines += render_kubernetes(r)
    lines += render_podman(r)
    lines += render_mission(r)
    lines += render_link(r)
    lines += render_tar(r)
    lines += render_targets(r)
    return lines


def render_kubernetes(r):
    # The Kubernetes path (issue: containerd snapshotter): a CRI pull as the kubelet
    # makes it, then the start-up as a container; overlayfs vs the Tessera snapshotter.
    cri = {row["method"]: row for row in r["rows"] if "CRI pull" in row["method"]}
    base = next((row for name, row in cri.items() if "overlayfs" in name), None)
    if not base:
        return []
    return ["", "Kubernetes path (CRI pull to the container's command done, the "
                "start-up run in a container by runc): "
            + "; ".join(f"{name} {row['total_seconds']:.2f} s "
                        f"({base['total_seconds'] / max(row['total_seconds'], 1e-9):.2f}x "
                        f"vs overlayfs, {mib(row['registry_bytes'])} from the registry)"
                        for name, row in cri.items()) + "."]


def render_podman(r):
    rows = {row["method"]: row for row in r["rows"]}
    plain, store = rows.get(PODMAN_PLAIN), rows.get(PODMAN_STORE)
    if not (plain and store):
        return []
    return ["", f"Podman (`podman pull` to the container's command done, the start-up run by "
                f"runc): through the Tessera layer store {store['total_seconds']:.2f} s "
                f"({mib(store['registry_bytes'])} from the registry), its own pull of the "
                f"plain image {plain['total_seconds']:.2f} s ({mib(plain['registry_bytes'])}): "
                f"{store.get('vs_podman_plain', 0):.2f}x."]


def render_mission(r):
    # ../shared/MISSION.md: a lazy start about 20x faster than a full pull (0.5x Nydus's
    # 3.9 s, 3.2 s with a prefetch list, fetching 54-64 MB, on a similar image and link).
    lazy = [row for row in r["rows"] if row["method"] in COLD_LAZY]
    if not lazy:
        return []
    best = max(row["vs_baseline"] for row in lazy)
    verdict = "met" if best >= 20 else "**missed**"
    figures = "; ".join(f"{row['method']} {row['vs_baseline']:.2f}x, "
                        f"{mib(row['registry_bytes'])} fetched" for row in lazy)
    return ["", f"Against the mission's target for a cold node (about 20x faster than a "
                f"full pull, fetching about what the start-up reads): {verdict}: {figures}."]


def render_link(r):
    """Where a start-up's time goes: waiting on reads vs what the link needs for the
    bytes sent (the least time any fetcher could take for them)."""
    shown = [row for row in r["rows"]
             if "read_wait_seconds" in row or row["method"] in NYDUS_ROWS]
    if not shown:
        return []
    lines = ["", "| method | start-up s | of which waiting for data s | "
                 "link time for the bytes sent s | bound |", "|---|---:|---:|---:|---|"]
    for row in shown:
        if "full local" in row["method"] or row.get("peer_bytes", 0) > row.get("origin_chunk_bytes", 0):
            bound = "not the link: the data is local or on a peer"
        elif row["link_seconds"] >= 0.7 * row["start_seconds"]:
            bound = "the link (fetch fewer bytes to go faster)"
        else:
            bound = "round trips (the reader waits on misses one at a time)"
        wait = f"{row['read_wait_seconds']:.2f}" if "read_wait_seconds" in row else "–"
        lines.append(f"| {row['method']} | {row['start_seconds']:.2f} | {wait} | "
                     f"{row['link_seconds']:.2f} | {bound} |")
    cold = [row for row in r["rows"] if row["method"] in COLD_LAZY]
    if cold:
        floor = min(row["link_seconds"] for row in cold)
        base = r["rows"][0]["total_seconds"]
        lines += ["", f"At this link the bytes these cold start-ups fetch allow at most "
                      f"{base / max(floor, 1e-9):.1f}x over the baseline, whatever the fetcher does."]
    return lines


def render_tar(r):
    rows = r.get("tar_rows") or []
    if not rows:
        return []
    trees = ", ".join(r.get("tar_trees", []))
    lines = ["", f"`tar -c` of {trees} (the image's largest trees; the archive piped and "
                 "discarded), page cache dropped, then again on the same mount:", "",
             "| through | page cache cold s | page cache warm s | MB/s cold | MB/s warm "
             "| vs nydusd cold | vs nydusd warm | registry sent |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        archive = row["archive_bytes"]
        lines.append(
            f"| {row['method']} | {row['cold_seconds']:.2f} | {row['warm_seconds']:.2f} | "
            f"{archive / 1e6 / row['cold_seconds']:.0f} | {archive / 1e6 / row['warm_seconds']:.0f} | "
            f"{ratio(row, 'vs_nydusd_cold')} | {ratio(row, 'vs_nydusd_warm')} | "
            f"{mib(row['registry_bytes'])} |")
    return lines


def render_targets(r):
    targets = r.get("targets") or []
    if not targets:
        return []

    def show(t, value):
        unit = t.get("unit", "")
        if unit == "x":
            return f"{value:.2f}x"
        return f"{value:.2f}%" if unit == "%" else f"{value:.0f} {unit}"
    lines = ["", "| target | measured | limit | verdict |", "|---|---:|---:|---|"]
    for t in targets:
        lines.append(f"| {t['target']} | {show(t, t['measured'])} | {show(t, t['limit'])} | "
                     f"{'met' if t['met'] else '**missed**'} |")
    return lines
