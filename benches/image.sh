#!/usr/bin/env bash
# The benchmark suite's realistic image: a Debian bookworm root filesystem (debootstrap,
# minbase, with Python) plus a data-science Python stack from PyPI (numpy, pandas, scipy,
# scikit-learn, matplotlib, sympy, pyarrow; byte-compiled), ~1 GB unpacked, as an OCI
# layout of two layers (the OS, the packages), and a version 2 that upgrades one package
# (pandas), for the dedup comparison. Its start-up (/app/start.py) imports the stack and
# computes a little, as a real service does when it starts.
#
#   benches/image.sh [OUT_DIR]     prints the layout's path; reuses a finished one
#
# Built once per recipe into OUT_DIR (default target/bench-cache/image-<recipe hash>):
# the inputs are pinned (the Debian snapshot date, every package version), so a rebuild
# gives the same files. TESSERA_BENCH_IMAGE_SMALL=1 makes the smoke-size image the test
# command uses: this machine's Python and a generated package (~60 MB, no network).
# Needs root, umoci, and for the full image debootstrap and network access to
# deb.debian.org and PyPI.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

SUITE=bookworm
MIRROR=${TESSERA_BENCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SMALL=${TESSERA_BENCH_IMAGE_SMALL:-0}
PACKAGES_V1="numpy==2.2.6 pandas==2.2.3 scipy==1.15.3 scikit-learn==1.6.1 matplotlib==3.10.3 sympy==1.14.0 pyarrow==20.0.0"
PACKAGES_V2=${PACKAGES_V1/pandas==2.2.3/pandas==2.3.1}
# The cache key: this script (every pinned input is in it) and the size asked for.
recipe=$( (cat "$0"; echo "$SMALL") | sha256sum | cut -c1-12)
OUT=${1:-$ROOT/target/bench-cache/image-$recipe}
if [ -f "$OUT/done" ]; then
    echo "$OUT"
    exit 0
fi

tools="umoci python3"
[ "$SMALL" = 1 ] || tools="$tools debootstrap"
for tool in $tools; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install debootstrap umoci python3" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "building the benchmark image needs root (debootstrap, chroot)" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
work=$OUT/work
mkdir -p "$work"
log=$OUT/build.log
step() { printf '[image] %s\n' "$*" >&2; }

small_image() {
    # The smoke size: this machine's Python (interpreter, libraries, standard library) as
    # the OS layer, and a generated package of 200 modules as the "stack" (v2 changes
    # one); no network, ~60 MB.
    local python lib v i
    python=$(realpath /usr/bin/python3)
    mkdir -p "$work/os/usr/bin" "$work/os/usr/lib" "$work/os/tmp" "$work/os/etc"
    chmod 1777 "$work/os/tmp"
    cp -L "$python" "$work/os/usr/bin/python3"
    for lib in $(ldd "$python" | grep -o '/[^ ]*'); do
        mkdir -p "$work/os$(dirname "$lib")"
        cp -L "$lib" "$work/os$lib"
    done
    cp -a "/usr/lib/$(basename "$python")" "$work/os/usr/lib/"
    cp /etc/passwd /etc/group "$work/os/etc/"
    for v in 1 2; do
        python3 - "$work/stack-v$v/benchpkg" "$v" <<'PY'
import os, random, sys
out, version = sys.argv[1], sys.argv[2]
os.makedirs(out)
for i in range(200):
    # Version 2 changes one module: a new release of one package.
    rnd = random.Random(i * 10 + (1 if version == "2" and i == 7 else 0))
    body = "\n".join(f"def f{j}(x):\n    return x * {rnd.randint(1, 999)} + {j}" for j in range(400))
    open(f"{out}/m{i:03}.py", "w").write(body + "\n")
open(f"{out}/__init__.py", "w").write("from . import " + ", ".join(f"m{i:03}" for i in range(50)) + "\n")
PY
    done
    mkdir -p "$work/os/app"
    cat >"$work/os/app/start.py" <<'PY'
import sys
sys.path.insert(0, "/opt/app/site-packages")
import argparse, decimal, email.parser, http.client, json, logging, urllib.request
import benchpkg
print("ready:", benchpkg.m007.f3(2))
PY
}
if [ "$SMALL" = 1 ]; then
small_image
else
step "debootstrap $SUITE (minbase + python3) from $MIRROR"
debootstrap --variant=minbase --include=python3,ca-certificates "$SUITE" "$work/os" "$MIRROR" >>"$log" 2>&1
# Timestamps and logs that differ per run are not part of the image's content.
rm -rf "$work/os/var/cache/apt/"*.bin "$work/os/var/log/"* "$work/os/var/lib/apt/lists/"*

# pip options for wheels of the image's interpreter (CPython 3.11 on x86_64 glibc).
WHEELS=(--python-version 3.11 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux_2_28_x86_64 --only-binary=:all:)
python_stack() { # python_stack DIR PACKAGES…: exactly these wheels, unpacked into DIR
    local dir=$1
    shift
    python3 -m pip install -q --no-deps --no-compile --target "$dir" "${WHEELS[@]}" "$@" >>"$log" 2>&1
}
deps() { # the pinned packages plus what they need, resolved once by pip
    # shellcheck disable=SC2086 # $2 is a list of requirements
    python3 -m pip install -q --dry-run --ignore-installed --report "$work/report-$1.json" \
        "${WHEELS[@]}" --target "$work/dry" $2 >>"$log" 2>&1
    python3 - "$work/report-$1.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(" ".join(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report["install"]))
PY
}
for v in 1 2; do
    pk=PACKAGES_V$v
    list=$(deps "$v" "${!pk}")
    read -r -a wheels <<<"$list"
    [ ${#wheels[@]} -gt 0 ] || { echo "pip resolved no wheels for: ${!pk} (see $log)" >&2; exit 1; }
    step "version $v: the Python stack (${#wheels[@]} wheels)"
    python_stack "$work/stack-v$v" "${wheels[@]}"
    # Byte-compiled with the image's own interpreter, as a Dockerfile's pip would: a
    # read-only mount cannot write __pycache__ at start-up.
    mkdir -p "$work/os/opt/app/site-packages"
    mount --bind "$work/stack-v$v" "$work/os/opt/app/site-packages"
    chroot "$work/os" python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash \
        /opt/app/site-packages >>"$log" 2>&1 || true
    umount "$work/os/opt/app/site-packages"
done
mkdir -p "$work/os/app"
cat >"$work/os/app/start.py" <<'PY'
# The service's start-up: import the stack, build a small frame, fit a model, plot.
import sys
sys.path.insert(0, "/opt/app/site-packages")
import numpy as np, pandas as pd, scipy.stats, sklearn.linear_model, pyarrow
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
x = np.linspace(0, 1, 1000)
frame = pd.DataFrame({"x": x, "y": 3 * x + scipy.stats.norm.rvs(size=x.size, random_state=1)})
model = sklearn.linear_model.LinearRegression().fit(frame[["x"]], frame["y"])
plt.plot(frame.x, frame.y)
print(f"ready: slope {model.coef_[0]:.2f}")
PY
fi

step "OCI layout: layer 1 the OS, layer 2 the Python stack (v1, then v2 over the same OS layer)"
umoci init --layout "$OUT/layout" >>"$log" 2>&1
umoci new --image "$OUT/layout:base" >>"$log" 2>&1
umoci unpack --image "$OUT/layout:base" "$work/bundle" >>"$log" 2>&1
cp -a "$work/os/." "$work/bundle/rootfs/"
umoci repack --image "$OUT/layout:os" "$work/bundle" >>"$log" 2>&1
rm -rf "$work/bundle"
for v in 1 2; do
    umoci unpack --image "$OUT/layout:os" "$work/bundle" >>"$log" 2>&1
    mkdir -p "$work/bundle/rootfs/opt/app/site-packages"
    cp -a "$work/stack-v$v/." "$work/bundle/rootfs/opt/app/site-packages/"
    umoci repack --image "$OUT/layout:v$v" "$work/bundle" >>"$log" 2>&1
    umoci config --image "$OUT/layout:v$v" --config.cmd python3 --config.cmd /app/start.py >>"$log" 2>&1
    rm -rf "$work/bundle"
done
umoci gc --layout "$OUT/layout" >>"$log" 2>&1
du -sb "$work/os" "$work/stack-v1" | awk '{ s += $1 } END { print s }' >"$OUT/unpacked-bytes"
if [ "$SMALL" = 1 ]; then
    echo "smoke size: this machine's Python and a generated package" >"$OUT/description"
else
    echo "Debian $SUITE + Python stack: $PACKAGES_V1" >"$OUT/description"
fi
rm -rf "$work"
touch "$OUT/done"
step "done: $(($(cat "$OUT/unpacked-bytes") >> 20)) MiB unpacked, layout $OUT/layout (tags v1, v2)"
echo "$OUT"
