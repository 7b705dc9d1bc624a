"""The restore scenario (benches/restore.rs, issue 29): time from "start" to a slow-booting
service's first correct answer on a cold node, booted (full pull, lazy mount) or restored
from a checkpoint (containerd's own `ctr containers restore`, Tessera's restore from a
lazy mount: cold, with lazy pages, with lazy pages and the recorded working set fetched
first, and with a peer holding the checkpoint); the checkpoints' sizes and the dedup
between the checkpoints of two versions of the app."""
from scenarios.common import mib

# Every row's figures, checked by check_results.py (positive numbers).
ROW_FIELDS = ["method", "fetch_seconds", "start_seconds", "total_seconds", "vs_cold_boot"]

COLD_BOOT = "boot: ctr pull + ctr run (cold node)"
LAZY_BOOT = "boot: tessera snapshotter, lazy (cold node)"
CTR_RESTORE = "ctr containers restore (checkpoint + image pulled)"
TESSERA_COLD = "tessera restore (cold node)"
TESSERA_PEER = "tessera restore, checkpoint on a peer"
TESSERA_LAZY = "tessera restore, lazy pages (cold node)"
TESSERA_WORKING_SET = "tessera restore, lazy pages + working set (cold node)"
ROWS = [COLD_BOOT, LAZY_BOOT, CTR_RESTORE, TESSERA_COLD, TESSERA_LAZY, TESSERA_WORKING_SET,
        TESSERA_PEER]
HEADLINE = "restore on a cold node: "


def number(value, positive=False):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value >= 0 and (value > 0 or not positive))


def check(r):
    problems = []
    rows = {row.get("method"): row for row in r.get("rows", [])}
    problems += [f"no row {name!r}" for name in ROWS if name not in rows]
    for name, row in rows.items():
        for key in ("registry_bytes", "origin_requests", "whole_seconds"):
            if not number(row.get(key)):
                problems.append(f"{name}: {key} = {row.get(key)!r}, not a number >= 0")
    if r.get("baseline") != COLD_BOOT or abs(rows.get(COLD_BOOT, {}).get("vs_cold_boot", 0) - 1) > 1e-9:
        problems.append(f"the baseline is not {COLD_BOOT!r} at 1x")
    # The peer row measures nothing if node B did not get the checkpoint from node A.
    peer = rows.get(TESSERA_PEER, {})
    if TESSERA_PEER in rows and not number(peer.get("peer_bytes"), positive=True):
        problems.append(f"{TESSERA_PEER}: peer_bytes = {peer.get('peer_bytes')!r}, nothing from peers")
    if not str(r.get("headline", "")).startswith(HEADLINE) or "× sooner than a cold boot" not in r.get("headline", ""):
        problems.append(f"headline = {r.get('headline')!r}, not '{HEADLINE}N× sooner than a cold boot'")
    working_set = r.get("working_set") or {}
    for key in ("chunks", "stored_bytes"):
        if not number(working_set.get(key), positive=True):
            problems.append(f"working_set.{key} = {working_set.get(key)!r}: nothing was recorded")
    if r.get("tessera_path") not in ("process", "containerd") or not r.get("tessera_path_note"):
        problems.append(f"tessera_path = {r.get('tessera_path')!r}: process or containerd, with a note")
    checkpoint = r.get("checkpoint") or {}
    for kind, keys in (("tessera", ("criu_bytes", "stored_bytes")),
                       ("containerd", ("criu_bytes", "registry_bytes"))):
        for key in keys:
            if not number((checkpoint.get(kind) or {}).get(key), positive=True):
                problems.append(f"checkpoint.{kind}.{key} is not a positive number")
    v2 = (r.get("dedup") or {}).get("v2") or {}
    if not (r.get("dedup") or {}).get("v2_chunk_dict") or not number(v2.get("dict_chunks"), positive=True):
        problems.append("dedup: v2's checkpoint took no chunk from v1's")
    for key in ("pushed_bytes", "reused_bytes"):
        if not number(v2.get(key), positive=True):
            problems.append(f"dedup.v2.{key} is not a positive number")
    targets = r.get("targets")
    if not isinstance(targets, list) or len(targets) < 2:
        problems.append("targets: issue 29's (vs a cold boot, vs ctr restore) expected")
    else:
        for t in targets:
            if not (isinstance(t.get("target"), str) and number(t.get("measured"))
                    and number(t.get("limit")) and isinstance(t.get("met"), bool)):
                problems.append(f"target {t!r}: target, measured, limit and met expected")
    return problems


def link_seconds(nbytes, cap):
    """Seconds a link of `cap` (`200mbit`, `1gbit`, `800kbit`) needs for `nbytes`, or None."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if cap.endswith(unit):
            try:
                return nbytes * 8 / (float(cap[: -len(unit)]) * scale)
            except ValueError:
                return None
    return None


def render_link(r, rows):
    """What the capped link allows: the cold restore's bytes at the link's speed."""
    cold, boot = rows.get(TESSERA_COLD), rows.get(COLD_BOOT)
    if not (cold and boot):
        return []
    link = link_seconds(cold["registry_bytes"], r["registry_cap"])
    if not link:
        return []
    return ["", f"Where the cold restore's time goes: the registry sent {mib(cold['registry_bytes'])} "
                f"for it (the checkpoint's chunks CRIU read and the rootfs's start-up files), "
                f"{link:.2f} s at {r['registry_cap']} of its {cold['total_seconds']:.2f} s; with "
                f"those bytes a cold restore can answer at most "
                f"{boot['total_seconds'] / max(link, 1e-9):.1f}x sooner than the cold boot, "
                f"whatever else it does."]


def render(r, plot_dir=None):
    rows = {row["method"]: row for row in r["rows"]}
    tessera, ctr = r["checkpoint"]["tessera"], r["checkpoint"]["containerd"]
    lines = [
        "## Restore instead of boot: a slow-booting service's first answer",
        "",
        f"**{r['headline']}**",
        "",
        f"(The fastest cold-node Tessera row: {r.get('headline_row', TESSERA_COLD)}.)",
        "",
        f"App: {r['image']} ({mib(r['image_unpacked_bytes'])} unpacked); `/app/serve.py` "
        f"imports the stack and builds its in-memory index (its boot on node A, registry "
        f"uncapped: {r['setup_boot_seconds']:.2f} s). It answers `GET {r['app_request']}` "
        f"with one document's row (a few pages of its heap, as a search service's requests "
        f"read) and `GET /` with a checksum of the whole index (all of it). "
        f"Registry egress capped at {r['registry_cap']}; median of {r['repetitions']} "
        f"interleaved repetitions; every row from its first command to the first correct "
        f"answer to `GET {r['app_request']}`, on a node with nothing cached; then `GET /` is "
        f"asked and checked (whole state: from the row's start to that answer).",
        "",
        "| method | fetch s | start s | first answer s | vs cold boot | whole state s "
        "| registry sent | origin requests | from peers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ROWS:
        row = rows.get(name)
        if not row:
            continue
        peers = mib(row["peer_bytes"]) if "peer_bytes" in row else "–"
        lines.append(
            f"| {row['method']} | {row['fetch_seconds']:.2f} | {row['start_seconds']:.2f} | "
            f"{row['total_seconds']:.2f} | {row['vs_cold_boot']:.2f}x | "
            f"{row['whole_seconds']:.2f} | {mib(row['registry_bytes'])} | {row.get('origin_requests', 0):.0f} | {peers} |")
    lines += [
        "",
        "Fetch: the pull (the ctr rows), or `tessera run`'s own figures for the checkpoint's "
        "mount and runc's restore (the Tessera rows); start: from then to the first correct "
        "answer (`ctr run` and the boot; the pull of the app image through the snapshotter "
        "and the wait for the first answer). vs cold boot: the cold "
        "boot's time / this time. Registry sent: the registry's interface counter; from "
        "peers: chunk bytes (uncompressed) node B got from node A. containerd's restore "
        "fetches its checkpoint with `ctr content fetch` (`ctr image pull` fetches it too, "
        "then fails to unpack a checkpoint index in containerd 1.6) and pulls the app image "
        "its rootfs comes from.",
        "",
        "`tessera run` fetches the whole checkpoint ahead of CRIU in restore order (its "
        "default `--prefetch all`); with `--lazy-pages` CRIU's lazy pages start the app "
        "before its memory has arrived, and the prefetch defaults to `none` (the "
        "lazy-pages daemon sends the rest after the restore). The working set was "
        "recorded once, on node A, by "
        f"`tessera run --lazy-pages --record-working-set http://…{r['app_request']}`: "
        f"{r['working_set']['chunks']} chunks ({mib(r['working_set']['stored_bytes'])} "
        f"stored) of the checkpoint read from the restore's start until that first answer, "
        "pushed beside the checkpoint as its referrer. The working-set row's `tessera run` "
        "finds it and its agent fetches those chunks first, many at once; the other "
        "Tessera rows run with `--no-working-set`.",
        "",
        f"Tessera rows: {r['tessera_path_note']}.",
    ]
    if r.get("tessera_path") == "process":
        lines += ["The boot and containerd rows run containers (runc); the Tessera rows "
                  "restore a process, without runc's container set-up (a few hundred ms)."]
    lines += [
        "",
        "| checkpoint | CRIU's files | in the registry | made in |",
        "|---|---:|---:|---|",
        f"| tessera checkpoint (v1) | {mib(tessera['criu_bytes'])} | "
        f"{mib(tessera['stored_bytes'])} (chunked, zstd) | dump {tessera['dump_seconds']:.2f} s, "
        f"build {tessera['build_seconds']:.2f} s, push {tessera['push_seconds']:.2f} s |",
        f"| ctr containers checkpoint --task --rw | {mib(ctr['criu_bytes'])} | "
        f"{mib(ctr['registry_bytes'])} (tar, uncompressed) | checkpoint "
        f"{ctr['checkpoint_seconds']:.2f} s, push {ctr['push_seconds']:.2f} s |",
    ]
    dedup = r["dedup"]
    v2 = dedup["v2"]
    lines += ["", f"Dedup between the checkpoints of v1 and v2 of the app (v2 is the image with one package upgraded): "
                  f"v2's checkpoint ({mib(v2['criu_bytes'])} of CRIU's files), built against "
                  f"v1's as its chunk dictionary, uploaded {mib(v2['pushed_bytes'])} and reused "
                  f"{mib(v2['reused_bytes'])} already in the registry; {v2['dict_chunks']} of its "
                  f"{v2['unique_chunks']} chunks are v1's (v1 alone uploaded "
                  f"{mib(dedup['v1']['pushed_bytes'])})."]
    for name in (TESSERA_LAZY, TESSERA_WORKING_SET):
        lazy = rows.get(name, {})
        if "pages_seconds" in lazy:
            lines += ["", f"{name}: the first answer after {lazy['total_seconds']:.2f} s; "
                          f"every page had arrived {lazy['pages_seconds']:.2f} s after the restore began."]
    lines += render_link(r, rows)
    lines += ["", "| target | measured | limit | verdict |", "|---|---:|---:|---|"]
    for t in r["targets"]:
        lines.append(f"| {t['target']} | {t['measured']:.2f}x | {t['limit']:.0f}x | "
                     f"{'met' if t['met'] else '**missed**'} |")
    return lines
