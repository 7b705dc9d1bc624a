"""The read-throughput scenario (benches/read.sh): sequential and random 4K reads of one
large file through a lazy mount, cold and warm, against nydusd (FUSE) on the same tree,
registry and link, curl of the blob, HTTP Range reads from the same registry and the
native filesystem, all in the same run."""
from scenarios.common import mib

# Every row's figures, checked by check_results.py.
ROW_FIELDS = ["method", "seconds", "bytes", "mib_per_s", "vs_baseline"]
# Every random-read row's figures too (from fio's JSON, or timed per request for HTTP).
RANDOM_FIELDS = ["iops", "lat_mean_us", "lat_p50_us", "lat_p99_us"]

# ../shared/MISSION.md: warm (cached) sequential reads >= 0.9x the native filesystem's;
# cold reads >= 0.9x of the origin link's speed. It states no target for random reads.
TARGET = 0.9


def check(r):
    problems = []
    for i, row in enumerate(r.get("rows", [])):
        if row.get("pattern") not in ("sequential", "random 4K"):
            problems.append(f"row {i}: pattern {row.get('pattern')!r}")
        if row.get("pattern") == "random 4K":
            for key in RANDOM_FIELDS:
                value = row.get(key)
                if not (isinstance(value, (int, float)) and value > 0):
                    problems.append(f"row {i} {key} = {value!r}, not a positive number")
    for pattern in ("sequential", "random 4K"):
        rows = [row for row in r.get("rows", []) if row.get("pattern") == pattern]
        names = {row["method"] for row in rows}
        if not any(row.get("method", "").startswith("tessera") for row in rows):
            problems.append(f"no tessera row for {pattern} reads")
        for row in rows:
            if row.get("baseline") not in names:
                problems.append(f"{pattern} {row.get('method')}: baseline "
                                f"{row.get('baseline')!r} is not a row")
    if not r.get("file_bytes", 0) > 0:
        problems.append("file_bytes: not a positive number")
    problems += check_nydusd(r)
    return problems


def check_nydusd(r):
    """nydusd's rows are there, with a ratio on every Tessera mount row, or the result
    says why they are not."""
    nydusd = r.get("nydusd")
    if not isinstance(nydusd, dict):
        return ["nydusd: neither figures nor the reason there are none"]
    if nydusd.get("skipped"):
        return []
    problems = []
    for pattern in ("sequential", "random 4K"):
        if not any(row.get("method", "").startswith("nydusd") and row.get("pattern") == pattern
                   for row in r.get("rows", [])):
            problems.append(f"no nydusd row for {pattern} reads")
    for row in r.get("rows", []):
        value = row.get("vs_nydusd")
        if row.get("method", "").startswith("tessera mount") and not (
                isinstance(value, (int, float)) and value > 0):
            problems.append(f"{row.get('pattern')} {row['method']}: vs_nydusd = {value!r}")
    for key in ("blob_bytes", "first_byte_seconds"):
        if not (isinstance(nydusd.get(key), (int, float)) and nydusd[key] > 0):
            problems.append(f"nydusd {key} = {nydusd.get(key)!r}, not a positive number")
    return problems


def us(value):
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def verdict(ratio):
    return "met" if ratio >= TARGET else "**missed**"


def find(r, pattern, prefix):
    return next((row for row in r["rows"]
                 if row["pattern"] == pattern and row["method"].startswith(prefix)), None)


def vs_nydusd(row):
    return f"{row['vs_nydusd']:.2f}x" if "vs_nydusd" in row else "–"


def fetched(row):
    if "origin_wire_bytes" not in row:
        return "–"
    if "chunks_fetched" in row:
        return f"{mib(row['origin_wire_bytes'])} ({row['chunks_fetched']} chunks)"
    return f"{mib(row['origin_wire_bytes'])} ({row['origin_requests']} requests)"


def nydusd_note(r):
    """What the nydusd rows are, or why there are none."""
    n = r.get("nydusd") or {}
    if n.get("skipped"):
        return [f"nydusd: not run ({n['skipped']}); no side-by-side figures."]
    return [f"nydusd {n['version']} (FUSE, registry backend, blobcache; no prefetch, as the "
            f"agent here) on a Nydus image of the same tree (`{n['image']}`), its blob "
            f"({mib(n['blob_bytes'])}) in the same registry behind the same link, interleaved "
            f"with Tessera's runs. Cold = a fresh nydusd with an empty blobcache; fresh mount "
            f"= a new nydusd over the blobcache the cold run filled. vs nydusd: nydusd's time "
            f"/ Tessera's (sequential) or Tessera's IOPS / nydusd's (random); above 1, "
            f"Tessera is faster."]


def link(r):
    cap = r.get("registry_cap", "none")
    if cap == "none":
        return "loopback, uncapped: the figures are what the agent's CPU allows"
    return f"in a network namespace, its egress capped at {cap}"


def render(r, plot_dir=None):
    seq = [row for row in r["rows"] if row["pattern"] == "sequential"]
    rnd = [row for row in r["rows"] if row["pattern"] != "sequential"]
    # The "vs nydusd" column only when nydusd ran.
    has_nydusd = any("vs_nydusd" in row for row in r["rows"])
    ncol, nsep = (" vs nydusd |", "---:|") if has_nydusd else ("", "")
    lines = [
        "## Read throughput: a lazy mount vs nydusd, HTTP and the native filesystem",
        "",
        f"One {mib(r['file_bytes'])} file (half pseudo-random, half text) in an image on a "
        f"local docker-registry ({link(r)}); its blob is {mib(r['blob_bytes'])} "
        f"compressed. Cold = a fresh agent with an empty chunk cache; warm = the same "
        f"mount again (the kernel's page cache) or a fresh mount (the agent's chunk cache).",
        "",
        *nydusd_note(r),
        "",
        f"### Sequential (`cat` of the whole file, median of {r['repetitions']})",
        "",
        f"| method | state | seconds | MiB/s of file data | vs baseline |{ncol} baseline |",
        f"|---|---|---:|---:|---:|{nsep}---|",
    ]
    for row in seq:
        nval = f" {vs_nydusd(row)} |" if has_nydusd else ""
        lines.append(f"| {row['method']} | {row['state']} | {row['seconds']:.3f} | "
                     f"{row['mib_per_s']:.0f} | {row['vs_baseline']:.2f}x |{nval} {row['baseline']} |")
    lines += [
        "",
        f"Ratio: the baseline's time / this time (above 1: faster). curl moves the "
        f"compressed blob at {r['curl_wire_mib_per_s']:.0f} MiB/s on the wire: the link's "
        f"ceiling for the same bytes. Time to first byte (`tessera mount` + a 1-byte read): "
        f"{r['first_byte_seconds'] * 1000:.0f} ms"
        + (f"; nydusd (start and mount, its bootstrap already on disk, + a 1-byte read): "
           f"{r['nydusd']['first_byte_seconds'] * 1000:.0f} ms." if has_nydusd else "."),
        "",
        f"### Random 4K (fio {r.get('fio_version', '')}: one reader, psync, queue depth 1, "
        f"the same seed)",
        "",
        "| method | state | reads | IOPS | MiB/s | mean µs | p50 µs | p99 µs | fetched from origin "
        f"| vs baseline (IOPS) |{ncol} baseline |",
        f"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|{nsep}---|",
    ]
    for row in rnd:
        nval = f" {vs_nydusd(row)} |" if has_nydusd else ""
        lines.append(
            f"| {row['method']} | {row['state']} | {row['bytes'] // 4096:,} | {row['iops']:,.0f} | "
            f"{row['mib_per_s']:.2f} | {us(row['lat_mean_us'])} | {us(row['lat_p50_us'])} | "
            f"{us(row['lat_p99_us'])} | {fetched(row)} | {row['vs_baseline']:.3f}x |{nval} "
            f"{row['baseline']} |")
    lines += [
        "",
        f"Cold: {r['random_cold_reads']} reads at the same offsets (fio's seed) through a "
        f"fresh mount and on the native file with its pages dropped (fadvise: the local "
        f"disk); the HTTP baseline is as many 4 KiB Range GETs of the blob at random "
        f"offsets, one at a time on one keep-alive connection: the round trip any lazy "
        f"reader pays per miss at the origin. Warm: {r['random_warm_reads']:,} reads each "
        f"(a quarter of the file's blocks, none twice; at most {r['random_warm_max_seconds']} s). "
        f"Ratio: this IOPS / the baseline's (above 1: faster).",
    ]
    cold_rnd, disk = find(r, "random 4K", "tessera mount, cold"), find(r, "random 4K", "native file, pages")
    if cold_rnd and disk:
        lines += ["", f"Cold random reads through the mount run at {cold_rnd['iops'] / disk['iops']:.2f}x "
                      f"the IOPS of the local disk; each miss fetches a whole chunk "
                      f"({mib(cold_rnd['origin_wire_bytes'] / max(1, cold_rnd['bytes'] // 4096))} "
                      f"from the origin per 4 KiB read, on average)."]
    # The mission's targets, where it states one.
    cold = find(r, "sequential", "tessera mount, cold")
    page = find(r, "sequential", "tessera mount, warm: same")
    chunk = find(r, "sequential", "tessera mount, warm: fresh")
    lines += ["", "Against the mission's targets:"]
    if cold:
        lines.append(f"- cold reads >= {TARGET}x the origin link's speed: {verdict(cold['vs_baseline'])}: "
                     f"a cold sequential read runs at {cold['vs_baseline']:.2f}x curl's speed "
                     f"on the same link ({r.get('registry_cap', 'none')}"
                     f"{', loopback' if r.get('registry_cap', 'none') == 'none' else ''}).")
    if page and chunk:
        lines.append(f"- warm (cached) sequential reads >= {TARGET}x the native filesystem's: "
                     f"from the page cache {verdict(page['vs_baseline'])} "
                     f"({page['vs_baseline']:.2f}x), from the chunk cache "
                     f"{verdict(chunk['vs_baseline'])} ({chunk['vs_baseline']:.2f}x).")
    lines.append("- random reads: the mission states no target; "
                 + ("the vs nydusd column sets them beside another lazy loader's, measured "
                    "in the same run." if has_nydusd else
                    "the ratios above are for comparison with other lazy loaders."))
    return lines
