"""The conversion scenario (benches/convert.sh): tessera convert against skopeo copy
(throughput, peak memory), tessera build against nydus-image create on the same unpacked
tree, and what a new image version uploads with fixed and content-defined chunking
against plain OCI layers."""
import math

from scenarios.common import mib

# Every throughput row's figures, checked by check_results.py.
ROW_FIELDS = ["method", "seconds", "input_mb_per_s", "peak_rss_bytes", "vs_baseline", "output_bytes"]
# Every build row's figures (part 2; checked by check() below: positive numbers too).
BUILD_FIELDS = ["method", "seconds", "input_mb_per_s", "peak_rss_bytes", "output_bytes"]
# Every dedup row's figures (checked by check() below: positive numbers too).
DEDUP_FIELDS = ["method", "v1_bytes", "v2_upload_bytes", "v2_pushed_bytes", "total_bytes",
                "vs_baseline"]

# ../shared/MISSION.md: tessera build >= 3x nydus-image create's throughput on the same
# tree (measured side by side: part 2); peak memory < 1 GiB for a 5 GB image; a new
# version uploads only the chunks that changed.
BUILD_VS_NYDUS = 3.0
GIB = 2**30
TESSERA_BUILD, NYDUS_CREATE = "tessera build --dir", "nydus-image create"


def positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value > 0


def check_build(b):
    """Part 2's figures: every row's, and the nydus-image row and ratio unless it says
    why it did not run."""
    problems = []
    rows = b.get("rows") or []
    methods = [row.get("method") for row in rows]
    if TESSERA_BUILD not in methods:
        problems.append(f"build: no {TESSERA_BUILD!r} row")
    for i, row in enumerate(rows):
        for key in BUILD_FIELDS:
            value = row.get(key)
            if key == "method":
                if not isinstance(value, str):
                    problems.append(f"build row {i} has no method")
            elif not positive(value):
                problems.append(f"build row {i} {key} = {value!r}, not a positive number")
        cpu = row.get("cpu_seconds")
        if not (positive(cpu) or cpu == 0):
            problems.append(f"build row {i} cpu_seconds = {cpu!r}, not a number of seconds")
    for key in ("tree_files", "tree_bytes", "read_seconds", "read_mb_per_s"):
        if not positive(b.get(key)):
            problems.append(f"build {key} = {b.get(key)!r}, not a positive number")
    if not isinstance(b.get("page_cache"), str):
        problems.append("build: page_cache does not say how the tree was read")
    nydus = b.get("nydus_image")
    if not isinstance(nydus, dict):
        problems.append("build: no nydus_image (its version, or why it was not run)")
    elif "skipped" in nydus:
        if not isinstance(nydus["skipped"], str) or not nydus["skipped"]:
            problems.append("build: nydus_image.skipped gives no reason")
        if NYDUS_CREATE in methods or "tessera_vs_nydus" in b:
            problems.append("build: nydus-image was skipped but has figures")
    else:
        if not isinstance(nydus.get("version"), str) or not isinstance(nydus.get("command"), str):
            problems.append("build: nydus_image names no version or command")
        by = {row.get("method"): row for row in rows}
        ratio = b.get("tessera_vs_nydus")
        if NYDUS_CREATE not in by:
            problems.append(f"build: nydus-image ran but there is no {NYDUS_CREATE!r} row")
        elif not positive(ratio):
            problems.append(f"build: tessera_vs_nydus = {ratio!r}, not a positive number")
        elif TESSERA_BUILD in by and positive(by[TESSERA_BUILD].get("seconds")) and \
                positive(by[NYDUS_CREATE].get("seconds")):
            expected = by[NYDUS_CREATE]["seconds"] / by[TESSERA_BUILD]["seconds"]
            if abs(ratio - expected) > 1e-6 * expected:
                problems.append(f"build: tessera_vs_nydus = {ratio}, but the rows' times give "
                                f"{expected}")
    return problems


def check(r):
    problems = []
    if "build" in r:
        problems += check_build(r["build"])
    dedup = r.get("dedup")
    if dedup is None:
        return problems  # a generated image has no second version
    if len(dedup) < 3:
        problems.append(f"dedup: {len(dedup)} rows; plain OCI and two chunkings expected")
    for i, row in enumerate(dedup):
        for key in DEDUP_FIELDS:
            value = row.get(key)
            if key == "method":
                if not isinstance(value, str):
                    problems.append(f"dedup row {i} has no method")
            elif not (isinstance(value, (int, float)) and value > 0):
                problems.append(f"dedup row {i} {key} = {value!r}, not a positive number")
    for row in dedup[1:]:
        # What tessera says it pushed must be what the registry grew by, give or take the
        # manifests, configs and link files (a few KiB).
        growth, pushed = row.get("v2_upload_bytes", 0), row.get("v2_pushed_bytes", 0)
        if isinstance(growth, int) and isinstance(pushed, int) and \
                abs(growth - pushed) > max(256 << 10, pushed // 20):
            problems.append(f"dedup {row['method']}: registry grew {growth} B, convert reports "
                            f"{pushed} B pushed")
    if not r.get("v2_changed_bytes", 0) > 0:
        problems.append("v2_changed_bytes: v2 should differ from v1")
    return problems


def throughput(r):
    lines = [
        "## Conversion: throughput and memory",
        "",
        f"Image: {r['image']}; {mib(r['input_bytes'])} of files, {mib(r['layer_bytes'])} of "
        f"gzip layers. Registry to registry on 127.0.0.1 (two registries, so nothing is "
        f"mounted instead of moved); median of {r['repetitions']} interleaved repetitions.",
        "",
        "| method | wall s | input MB/s | peak RSS | vs skopeo copy (time) | output |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['method']} | {row['seconds']:.2f} | {row['input_mb_per_s']:.0f} | "
            f"{mib(row['peak_rss_bytes'])} | {row['vs_baseline']:.2f}x | {mib(row['output_bytes'])} |")
    p = r["convert_phases"]
    lines += [
        "",
        "Input MB/s: the image's file bytes (MB = 10^6) / wall time. Ratio: skopeo's time / "
        "this time (below 1: slower; skopeo moves compressed layers and builds nothing). "
        f"Convert's phases (median): pull {p['pull_seconds']:.2f} s, build "
        f"{p['build_seconds']:.2f} s ({r['build_mb_per_s']:.0f} MB/s of input, from the "
        f"gzip layers; it reads each layer as it downloads, so the two overlap), push "
        f"{p['push_seconds']:.2f} s.",
    ]
    tessera = [row for row in r["rows"] if row["method"].startswith("tessera")]
    if tessera:
        rss = tessera[0]["peak_rss_bytes"]
        size_gb = r["input_bytes"] / 1e9
        if rss >= GIB:
            verdict = "**missed**"
        elif size_gb >= 5:
            verdict = "met"
        else:
            verdict = (f"met at this size only ({size_gb:.1f} GB; the target names 5 GB: "
                       f"`TESSERA_BENCH_CONVERT_MB=5120 make bench-convert`)")
        lines += ["", f"Against the mission's memory bound (< 1 GiB for a 5 GB image): {verdict}: "
                      f"peak RSS {mib(rss)}."]
    return lines


def build(r):
    b = r["build"]
    rows = b["rows"]
    nydus = b["nydus_image"]
    lines = [
        "## Conversion: build from the unpacked tree",
        "",
        f"v1 unpacked with umoci: {b['tree_files']:,} files, {mib(b['tree_bytes'])}. Page "
        f"cache: {b['page_cache']}. Each build writes its bootstrap and blob into a fresh "
        f"directory on the same disk; median of {b['repetitions']} interleaved repetitions, "
        f"alternating which goes first.",
        "",
        "| method | wall s | input MB/s | CPU s | peak RSS | vs nydus-image create (time) | "
        "output |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = next((row for row in rows if row["method"] == NYDUS_CREATE), None)
    for row in rows:
        vs = f"{base['seconds'] / row['seconds']:.2f}x" if base else "–"
        lines.append(
            f"| {row['method']} | {row['seconds']:.2f} | {row['input_mb_per_s']:.0f} | "
            f"{row['cpu_seconds']:.2f} | {mib(row['peak_rss_bytes'])} | {vs} | "
            f"{mib(row['output_bytes'])} |")
    note = ("Input MB/s: the tree's file bytes (MB = 10^6; a hard-linked file once) / wall "
            "time of the process. CPU s: its user + system time (above the wall time: it "
            "used more than one core). Output: bootstrap + blob. Tessera with its defaults (zstd "
            "level 3, fixed 1 MiB chunks, sha256 digests)")
    if "skipped" not in nydus:
        note += (f"; nydus-rs {nydus['version']} as `{nydus['command']}` (zstd level 3, "
                 f"blake3 digests: its defaults). Ratio: nydus-image's time / this time "
                 f"(above 1: faster)")
    lines += ["", note + ".", "",
              f"Reading the tree alone, measured the same way (every file `cat` to nowhere, "
              f"8 readers at once): {b['read_seconds']:.2f} s, {b['read_mb_per_s']:.0f} MB/s: "
              f"the disk's floor under either builder here."]
    if "skipped" in nydus:
        lines += ["", f"nydus-image: not run ({nydus['skipped']}); the mission's build target "
                      f"(>= {BUILD_VS_NYDUS:.0f}x nydus-image create's throughput on the same "
                      f"tree) is not judged."]
    else:
        x = b["tessera_vs_nydus"]
        verdict = "met" if x >= BUILD_VS_NYDUS else "**missed**"
        lines += ["", f"tessera build vs nydus-image create: {x:.2f}x the throughput "
                      f"({rows[0]['input_mb_per_s']:.0f} against {base['input_mb_per_s']:.0f} "
                      f"MB/s). Against the mission's build target (>= {BUILD_VS_NYDUS:.0f}x, "
                      f"side by side on the same tree): {verdict}."]
    return lines


def dedup(r):
    rows = r["dedup"]
    base = rows[0]
    lines = [
        "## Conversion: what a new version uploads",
        "",
        f"v1, then v2 (one package upgraded: {r['v2_changed_files']:,} file contents v1 "
        f"lacks, {mib(r['v2_changed_bytes'])} uncompressed) into one registry; tessera's v2 "
        f"conversion uses v1 as its chunk dictionary (`--chunk-dict`). Bytes are the "
        f"registry's storage growth (the sizes of its blob files, manifests included).",
        "",
        "| method | v1 stored | v2 uploads | convert says pushed | v1 + v2 stored | "
        "v2 chunks new / from v1 | vs plain OCI (v2 upload) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        chunks = (f"{row['v2_new_chunks']:,} / {row['v2_dict_chunks']:,}"
                  if "v2_new_chunks" in row else "–")
        lines.append(
            f"| {row['method']} | {mib(row['v1_bytes'])} | {mib(row['v2_upload_bytes'])} | "
            f"{mib(row['v2_pushed_bytes'])} | {mib(row['total_bytes'])} | {chunks} | "
            f"{row['vs_baseline']:.1f}x |")
    fixed = [row for row in rows[1:] if "fixed" in row["method"]]
    cdc = [row for row in rows[1:] if "CDC" in row["method"]]
    lines += ["", "Ratio: plain OCI's v2 upload / this v2 upload (above 1: fewer bytes). "
                  "A v2 upload includes its bootstrap (the whole file tree, every version)."]
    if fixed and cdc:
        f = fixed[0]
        lines += ["", "Fixed vs CDC (v2 upload, fixed / CDC; above 1: CDC uploads less): " + "; ".join(
            f"{c['method']}: {f['v2_upload_bytes'] / c['v2_upload_bytes']:.2f}x" for c in cdc) + "."]
    if fixed:
        # The chunks that had to travel: v2's new file contents, compressed as the image
        # compresses. A new blob within a quarter of that is "only what changed".
        f = fixed[0]
        expected = r["v2_changed_bytes"] / f["compression_ratio"]
        blob = f.get("v2_new_blob_bytes", 0)
        verdict = "met" if blob <= 1.25 * expected else "**missed**"
        lines += ["", f"Against the mission's target (a new version uploads only changed chunks): "
                      f"{verdict}: with {f['method']} v2's new blob is {mib(blob)}, "
                      f"{blob / expected:.2f}x its changed file contents compressed at the "
                      f"image's ratio ({mib(expected)}); with the bootstrap, config and manifest "
                      f"it uploads {mib(f['v2_upload_bytes'])}, where plain OCI layers upload "
                      f"{mib(base['v2_upload_bytes'])}."]
    return lines


def render(r, plot_dir=None):
    lines = throughput(r)
    if r.get("build"):
        lines += [""] + build(r)
    if r.get("dedup"):
        lines += [""] + dedup(r)
    return lines
