#!/usr/bin/env bash
# The local demo cluster (`make demo`, `make demo-stop`):
#
#   scripts/demo.sh [start]   install what is missing, build, start a registry, a scheduler
#                             and 3 agents, convert a sample image, start it lazily on the
#                             first agent, then on the other two; then checkpoint a booted
#                             Python server and restore it from a lazy mount instead of
#                             booting it again; print a report
#   scripts/demo.sh stop      unmount and stop everything the demo started
#
# Every agent is a "node" of its own: a network namespace on a bridge (198.19.S.0/24, in
# the benchmarking range, so it clashes with no real network) when the demo runs as root,
# otherwise a set of loopback ports. The registry and the scheduler run beside the demo
# itself. The sample image is a small Python "application": an interpreter, its standard
# library and a data file; its start-up runs the interpreter from the lazy mount
# (chroot), which reads a few dozen files of it.
#
# The restore needs CRIU 4.2.1 (`make criu-deps` builds it into target/tools/criu; the
# demo builds it when it is missing, about 2 minutes; DEMO_CRIU names another binary).
#
# Knobs (environment): DEMO_OUT (default demo-out) holds every file, log and mount;
# DEMO_BIN_DIR uses tessera and tessera-scheduler from there instead of building them;
# DEMO_DATA_MB sizes the data file the start-up does not read (default 64);
# DEMO_NETNS=0 forces loopback ports; DEMO_NAME (default tsd) names the namespaces and
# DEMO_SUBNET (default 254) picks 198.19.S.0/24, so two demos can run side by side.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${DEMO_OUT:-demo-out}
name=${DEMO_NAME:-tsd}
subnet=${DEMO_SUBNET:-254}
data_mb=${DEMO_DATA_MB:-64}
agents=3

say() { printf '== %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------
# stop: everything the demo started (its processes are found by the files under $out they
# name; its namespaces are listed in $out/state), then a check that nothing is left. Safe
# to run twice, and after a half-finished start.
stop() {
  local state=$out/state
  [ -f "$state" ] || { echo "demo: nothing to stop (no $state)"; return 0; }
  # The demo's processes: every one names a file under $out on its command line.
  local abs
  abs=$(realpath "$out")
  pids() { # pids PROGRAM-REGEX
    local pid
    for pid in $(pgrep -f -- "$abs/" || true); do
      grep -qxE "$1" "/proc/$pid/comm" 2>/dev/null && echo "$pid"
    done
  }
  # Agents first: on SIGTERM an agent unmounts its images and leaves the swarm.
  local pid
  for pid in $(pids tessera); do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do
    [ -z "$(pids tessera)" ] && break
    sleep 0.1
  done
  # Then the scheduler and the registry; whatever did not go quietly is killed, and its
  # mounts detached.
  for pid in $(pids 'tessera-schedul|docker-registry|python3.*'); do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in $(pids 'tessera|tessera-schedul|docker-registry|python3.*'); do kill -KILL "$pid" 2>/dev/null || true; done
  sleep 0.2
  local mnt
  for mnt in $(awk -v d="$abs/" 'index($2, d) == 1 { print $2 }' /proc/mounts); do
    fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  done
  local ns
  for ns in $(grep '^netns ' "$state" | cut -d' ' -f2 | tac); do
    ip netns del "$ns" 2>/dev/null || true
  done
  if grep -q '^link ' "$state"; then
    ip link del "$(grep '^link ' "$state" | cut -d' ' -f2)" 2>/dev/null || true
  fi
  # The check: no process, mount or namespace of the demo remains.
  local problems=""
  for pid in $(pids 'tessera|tessera-schedul|docker-registry|python3.*'); do
    problems="$problems process $pid ($(cat "/proc/$pid/comm" 2>/dev/null));"
  done
  awk -v d="$abs/" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/mounts &&
    problems="$problems mounts under $abs;"
  for ns in $(grep '^netns ' "$state" | cut -d' ' -f2); do
    [ -e "/run/netns/$ns" ] && problems="$problems namespace $ns;"
  done
  [ -z "$problems" ] || die "could not stop everything:$problems"
  rm -f "$state"
  echo "demo stopped: nothing of it is mounted or running (files stay in $out)"
}

if [ "${1:-start}" = stop ]; then
  stop
  exit 0
fi
[ "${1:-start}" = start ] || die "usage: scripts/demo.sh [start|stop]"

# ---------------------------------------------------------------------------------------
say "what the demo needs"
need_pkgs=""
for p in docker-registry:docker-registry umoci:umoci skopeo:skopeo fusermount3:fuse3 \
  ip:iproute2 nsenter:util-linux /usr/bin/python3:python3 chroot:coreutils; do
  command -v "${p%%:*}" >/dev/null || need_pkgs="$need_pkgs ${p#*:}"
done
if [ -n "$need_pkgs" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing:$need_pkgs"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need_pkgs
  else
    die "missing:$need_pkgs — install these Debian packages (as root: apt-get install$need_pkgs)"
  fi
fi
[ -e /dev/fuse ] || die "/dev/fuse is missing: load the fuse module (modprobe fuse)"
[ "$(id -u)" = 0 ] || die "the demo mounts images through FUSE and runs them with chroot: run it as root"

criu=${DEMO_CRIU:-target/tools/criu/criu}
if [ ! -x "$criu" ]; then
  say "building CRIU 4.2.1 for the restore (make criu-deps; once, about 2 minutes)"
  bash scripts/criu-deps.sh
fi
criu=$(realpath "$criu")

if [ -n "${DEMO_BIN_DIR:-}" ]; then
  bin=$DEMO_BIN_DIR
else
  say "building tessera and tessera-scheduler (release)"
  cargo build --release -p tessera-agent -p tessera-scheduler --quiet
  bin=target/release
fi
tessera=$(realpath "$bin/tessera")
scheduler_bin=$(realpath "$bin/tessera-scheduler")
[ -x "$tessera" ] && [ -x "$scheduler_bin" ] || die "no tessera / tessera-scheduler in $bin"

# A demo already running is stopped first, so `make demo` can be run again.
[ -f "$out/state" ] && stop
rm -rf "$out"
mkdir -p "$out"
out=$(realpath "$out")
state=$out/state
: > "$state"
# A start that fails half-way leaves nothing behind.
trap 'status=$?; if [ $status != 0 ]; then echo "demo: failed; logs in $out; stopping what was started" >&2; stop || true; fi' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The nodes. In namespace mode each agent N has its own network namespace and address
# 198.19.S.N, joined by a bridge (in a namespace of its own) to the demo's side, which
# holds 198.19.S.254 and runs the registry and the scheduler there.
netns=${DEMO_NETNS:-auto}
if [ "$netns" = auto ]; then
  if ip netns list >/dev/null 2>&1 && command -v nsenter >/dev/null; then netns=1; else netns=0; fi
fi
on_node() { # on_node N: the command prefix that runs a program in node N's network
  if [ "$netns" = 1 ]; then node=(nsenter --net="/run/netns/$name-$1" --); else node=(); fi
}
if [ "$netns" = 1 ]; then
  say "making $agents nodes: network namespaces $name-1..$agents on 198.19.$subnet.0/24"
  # Left over from a demo that was killed rather than stopped.
  for ns in $(ip netns list | awk -v p="$name-" 'index($1, p) == 1 { print $1 }'); do ip netns del "$ns"; done
  ip link del "${name}r" 2>/dev/null || true
  ip netns add "$name-br" && echo "netns $name-br" >> "$state"
  ip -n "$name-br" link add br0 type bridge
  ip -n "$name-br" link set br0 up
  ip link add "${name}r" type veth peer name "${name}rb" && echo "link ${name}r" >> "$state"
  ip link set "${name}rb" netns "$name-br"
  ip -n "$name-br" link set "${name}rb" master br0 up
  ip addr add "198.19.$subnet.254/24" dev "${name}r"
  ip link set "${name}r" up
  for n in $(seq $agents); do
    ip netns add "$name-$n" && echo "netns $name-$n" >> "$state"
    ip -n "$name-$n" link set lo up
    ip link add "${name}h$n" type veth peer name "${name}x$n"
    ip link set "${name}x$n" netns "$name-$n"
    ip -n "$name-$n" link set "${name}x$n" name eth0
    ip link set "${name}h$n" netns "$name-br"
    ip -n "$name-br" link set "${name}h$n" master br0 up
    ip -n "$name-$n" addr add "198.19.$subnet.$n/24" dev eth0
    ip -n "$name-$n" link set eth0 up
  done
  hub=198.19.$subnet.254
  node_ip() { echo "198.19.$subnet.$1"; }
else
  say "no network namespaces here: the $agents agents share loopback, each on its own ports"
  hub=127.0.0.1
  node_ip() { echo 127.0.0.1; }
fi

registry_port=$(free_port)
registry=$hub:$registry_port
say "starting the registry (CNCF distribution) at $registry"
mkdir -p "$out/registry"
printf 'version: 0.1\nlog: {level: error}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
  "$out/registry" "$registry" > "$out/registry.yml"
setsid docker-registry serve "$out/registry.yml" > "$out/registry.log" 2>&1 < /dev/null &
disown

scheduler_port=$(free_port)
admin_port=$(free_port)
scheduler_url=http://$hub:$scheduler_port
admin_url=http://127.0.0.1:$admin_port
say "starting the scheduler at $scheduler_url (admin API at $admin_url)"
# Tokens, as a real install has them: one shared by the agents and the scheduler, one for
# the admin API.
head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$out/p2p-token"
head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$out/admin-token"
chmod 600 "$out/p2p-token" "$out/admin-token"
setsid "$scheduler_bin" --listen "$hub:$scheduler_port" --token-file "$out/p2p-token" \
  --admin-listen "127.0.0.1:$admin_port" --admin-token-file "$out/admin-token" \
  --state-dir "$out/scheduler-state" > "$out/scheduler.log" 2>&1 < /dev/null &
disown

wait_for() { # wait_for WHAT COMMAND…: up to 20 s
  local what=$1
  shift
  for _ in $(seq 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not come up (logs in $out)"
}
wait_for "the registry" curl -fsS "http://$registry/v2/"
wait_for "the scheduler" curl -fsS "$admin_url/readyz"

say "making the sample image: a Python application (interpreter, standard library, ${data_mb} MiB of data)"
rootfs=$out/rootfs
mkdir -p "$rootfs/usr/bin" "$rootfs/usr/lib" "$rootfs/app" "$rootfs/etc"
# Debian's interpreter (not a pyenv shim or a venv's): a real ELF file with its libraries.
python=$(realpath /usr/bin/python3)
pyver=$("$python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
cp -L "$python" "$rootfs/usr/bin/python3"
for lib in $(ldd "$python" | grep -o '/[^ ]*'); do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
cp -a "/usr/lib/$pyver" "$rootfs/usr/lib/"
cp /etc/passwd /etc/group "$rootfs/etc/"
cat > "$rootfs/app/main.py" <<'PY'
# The demo application's start-up: the imports a small web service makes, and a look at
# the first MiB of its data. Everything else in the image stays unread (and unfetched).
import argparse, decimal, email.parser, http.client, json, logging, urllib.request
with open("/app/data.bin", "rb") as f:
    head = f.read(1 << 20)
print(f"app ready: {len(head)} bytes of data read")
PY
head -c $((data_mb << 20)) /dev/urandom > "$rootfs/app/data.bin"
umoci init --layout "$out/layout" >/dev/null
umoci new --image "$out/layout:v1" >/dev/null
# unpack + repack rather than `umoci insert`: umoci 0.4.7's insert can write a
# truncated layer.
umoci unpack --image "$out/layout:v1" "$out/bundle" >/dev/null
cp -a "$rootfs/." "$out/bundle/rootfs/"
umoci repack --image "$out/layout:v1" "$out/bundle" >/dev/null
rm -rf "$out/bundle"
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$out/layout:v1" "docker://$registry/demo/app:v1"

# One config for convert and the agents: the demo registry speaks plain HTTP.
printf '[registry]\ninsecure = ["%s"]\n' "$registry" > "$out/tessera.toml"
mkdir -p "$out/docker-config" # no node credentials: the demo registry is open
export DOCKER_CONFIG=$out/docker-config

say "tessera convert $registry/demo/app:v1 -> $registry/demo/app:v1-tessera"
"$tessera" convert --config "$out/tessera.toml" "$registry/demo/app:v1" "$registry/demo/app:v1-tessera"
image=$registry/demo/app:v1-tessera

say "starting $agents agents"
for n in $(seq $agents); do
  dir=$out/agent$n
  mkdir -p "$dir/mnt"
  if [ "$netns" = 1 ]; then
    peer=$(node_ip "$n"):7081
    metrics=$(node_ip "$n"):9464
  else
    peer=127.0.0.1:$(free_port)
    metrics=127.0.0.1:$(free_port)
  fi
  echo "$metrics" > "$dir/metrics-address"
  on_node "$n"
  # setsid and nsenter exec what they run: a single process, the agent itself.
  TESSERA_LOG=info setsid "${node[@]}" "$tessera" agent --config "$out/tessera.toml" --socket "$dir/agent.sock" \
    --cache-dir "$dir/cache" --metrics-listen "$metrics" --scheduler "$scheduler_url" \
    --p2p-token-file "$out/p2p-token" --peer-listen "$peer" --advertise "$peer" \
    --host-id "agent$n" --zone demo > "$dir/agent.log" 2>&1 < /dev/null &
  disown
done
for n in $(seq $agents); do
  wait_for "agent $n" python3 - "$out/agent$n/agent.sock" "$tessera" <<'PY'
import json, subprocess, sys
s = json.loads(subprocess.run([sys.argv[2], "status", "--json", "--socket", sys.argv[1]],
                              capture_output=True, check=True).stdout)
sys.exit(0 if s.get("swarm", {}).get("registered") else 1)
PY
done

now() { date +%s.%N; }
startup() { # startup N: mount on agent N, then run the application from the mount
  local dir=$out/agent$1 t0 t1 t2
  t0=$(now)
  "$tessera" mount --socket "$dir/agent.sock" "$image" "$dir/mnt" > /dev/null
  t1=$(now)
  chroot "$dir/mnt" /usr/bin/python3 /app/main.py > "$dir/startup.out"
  t2=$(now)
  echo "$t0 $t1 $t2" > "$dir/times"
}

say "agent 1: mount lazily and start the application (everything comes from the registry)"
startup 1
cat "$out/agent1/startup.out"
say "agents 2 and 3: the same, at once (chunks now come from agent 1 and each other)"
startup 2 &
p2=$!
startup 3 &
p3=$!
wait $p2
wait $p3

for n in $(seq $agents); do
  "$tessera" status --json --socket "$out/agent$n/agent.sock" > "$out/agent$n/status.json"
done
image_bytes=$(du -sb "$rootfs" | cut -f1)

say "restore instead of boot: a Python server that takes seconds to boot, checkpointed and restored"
# Its boot derives a key the slow way (as a service warms up: seconds of CPU, little
# memory) and holds 32 MiB of state; every answer is the request count, the state's
# sha256 and the key.
cat > "$out/server.py" <<'PY'
import hashlib, http.server, os, sys
key = hashlib.pbkdf2_hmac("sha256", b"demo", b"salt", 8_000_000).hex()[:16]
state = bytearray(os.urandom(32 << 20))
count = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"{count} {hashlib.sha256(state).hexdigest()} {key}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PY
server_port=$(free_port)
first_answer() { # first_answer: waits up to 60 s for the server's first answer
  for _ in $(seq 600); do
    curl -fsS "http://127.0.0.1:$server_port/" 2>/dev/null && return 0
    sleep 0.1
  done
  die "the server did not answer (logs in $out)"
}
t0=$(now)
setsid "$python" "$out/server.py" "$server_port" > "$out/server.log" 2>&1 < /dev/null &
server_pid=$!
disown
first_answer > "$out/boot.answer"
t1=$(now)
echo "booted in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s: $(cat "$out/boot.answer")"
"$tessera" checkpoint --config "$out/tessera.toml" --criu "$criu" --pid "$server_pid" \
  "$registry/demo/server:ckpt" | tee "$out/checkpoint.out"
t2=$(now)
"$tessera" restore --config "$out/tessera.toml" --criu "$criu" --socket "$out/agent3/agent.sock" \
  --json --work-dir "$out" "$registry/demo/server:ckpt" > "$out/restore.json"
first_answer > "$out/restore.answer"
t3=$(now)
echo "restored on agent 3 in $(python3 -c "print(f'{$t3 - $t2:.2f}')") s: $(cat "$out/restore.answer")"
echo "$t0 $t1 $t2 $t3" > "$out/restore-times"

say "report"
python3 - "$out" "$agents" "$image_bytes" <<'PY'
import json, sys
out, agents, image_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mib = lambda b: b / 2**20
rows, total_origin, total_wire, total_peer = [], 0, 0, 0
print(f"{'node':<8}{'read':>10}{'origin':>10}{'peers':>10}{'MiB/s':>8}{'first byte':>12}{'mounted':>10}{'ready':>9}")
for n in range(1, agents + 1):
    status = json.load(open(f"{out}/agent{n}/status.json"))
    (m,) = status["mounts"]
    t0, t1, t2 = map(float, open(f"{out}/agent{n}/times").read().split())
    pull = m["pull"]
    fetched = pull["origin_bytes"] + pull["peer_bytes"]
    row = {
        "node": f"agent{n}",
        "bytes_read": m["bytes_read"],
        "origin_bytes": pull["origin_bytes"],
        "origin_wire_bytes": pull["origin_wire_bytes"],
        "peer_bytes": pull["peer_bytes"],
        "cache_bytes": pull["cache_bytes"],
        "mib_per_s": mib(fetched) / max(t2 - t1, 1e-3),
        "first_byte_seconds": m["first_byte_seconds"],
        "mount_seconds": t1 - t0,
        "ready_seconds": t2 - t0,
        "verification_failures": pull["verification_failures"],
    }
    rows.append(row)
    total_origin += pull["origin_bytes"]
    total_wire += pull["origin_wire_bytes"]
    total_peer += pull["peer_bytes"]
    fb = row["first_byte_seconds"]
    print(f"{row['node']:<8}{mib(row['bytes_read']):>6.1f} MiB{mib(row['origin_bytes']):>6.1f} MiB"
          f"{mib(row['peer_bytes']):>6.1f} MiB{row['mib_per_s']:>8.1f}"
          f"{(f'{fb * 1000:.0f} ms' if fb is not None else '-'):>12}"
          f"{row['mount_seconds'] * 1000:>7.0f} ms{row['ready_seconds'] * 1000:>6.0f} ms")
fetched = rows[0]["origin_bytes"] + rows[0]["peer_bytes"]
print(f"image: {mib(image_bytes):.1f} MiB unpacked; a start-up read {mib(rows[0]['bytes_read']):.1f} MiB of it "
      f"({100 * rows[0]['bytes_read'] / image_bytes:.0f}%) and fetched {mib(fetched):.1f} MiB with read-ahead "
      f"({100 * fetched / image_bytes:.0f}%): the rest never left the registry")
first = max(rows[0]["origin_bytes"], 1)
print(f"registry sent {mib(total_wire):.1f} MiB of compressed chunks ({mib(total_origin):.1f} MiB uncompressed) "
      f"for {agents} start-ups ({total_origin / first:.2f}x what one start-up fetched); "
      f"peers sent {mib(total_peer):.1f} MiB")
print("columns: read = bytes the application read; origin/peers = uncompressed chunk bytes fetched from the "
      "registry / from other agents (as tessera status, /metrics and the scheduler's stats count them); MiB/s = fetched bytes per second of start-up; first byte = from the mount request "
      "to the first byte read; mounted = the mount call; ready = mount plus start-up")
t0, t1, t2, t3 = map(float, open(f"{out}/restore-times").read().split())
booted, restored = open(f"{out}/boot.answer").read().split(), open(f"{out}/restore.answer").read().split()
summary = json.load(open(f"{out}/restore.json"))
restore = {
    "boot_seconds": t1 - t0,
    "restore_seconds": t3 - t2,
    "same_state": booted[1:] == restored[1:],
    "count_before": int(booted[0]),
    "count_after": int(restored[0]),
    "checkpoint_bytes_read": summary["bytes_read"],
    "origin_wire_bytes": summary["origin_wire_bytes"],
}
print(f"restore: the server answered {restore['restore_seconds']:.2f} s after `tessera restore` began, "
      f"{restore['boot_seconds'] / max(restore['restore_seconds'], 1e-3):.1f}x sooner than its "
      f"{restore['boot_seconds']:.2f} s boot, with the same state "
      f"({'yes' if restore['same_state'] else 'NO'}) and its request count going on "
      f"({restore['count_before']} -> {restore['count_after']}); CRIU read "
      f"{mib(restore['checkpoint_bytes_read']):.1f} MiB through the lazy mount, "
      f"{mib(restore['origin_wire_bytes']):.1f} MiB came from the registry")
json.dump({"agents": rows, "image_bytes": image_bytes, "origin_bytes": total_origin,
           "origin_wire_bytes": total_wire, "peer_bytes": total_peer, "restore": restore},
          open(f"{out}/report.json", "w"), indent=2)
PY

say "the scheduler's admin API"
echo "$admin_url  (token: $out/admin-token)"
"$scheduler_bin" admin --url "$admin_url" --token-file "$out/admin-token" stats
"$scheduler_bin" admin --url "$admin_url" --token-file "$out/admin-token" hosts
cat <<EOF

The demo is running:
  images mounted at   $out/agent{1,2,3}/mnt   (e.g. ls $out/agent2/mnt/usr/lib)
  the restored server curl http://127.0.0.1:$server_port/   (checkpoint: $registry/demo/server:ckpt)
  an agent's status   $tessera status --socket $out/agent1/agent.sock
  its metrics         curl http://$(cat "$out/agent1/metrics-address")/metrics$( [ "$netns" = 1 ] && echo "   (from the host: the agents' addresses are on the demo bridge)")
  the admin API       $scheduler_bin admin --url $admin_url --token-file $out/admin-token hosts|blobs|images|stats
                      curl -H "Authorization: Bearer \$(cat $out/admin-token)" $admin_url/api/v1/stats
  logs                $out/*.log, $out/agent*/agent.log
Stop it (unmounts, stops every process, removes the namespaces):
  make demo-stop      (or: scripts/demo.sh stop)
EOF
trap - EXIT
