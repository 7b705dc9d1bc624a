"""Shared helpers of the chart tests: rendering with helm, and reading what it rendered.

Everything the tests need is installed by `make test-deps`: helm (built from the Go
module proxy into target/tools/bin) and kubernetes-validate with PyYAML (a venv in
target/tools/kubeval, whose python runs these tests). A missing piece fails the
tests saying what to install; nothing is skipped.
"""

import base64
import json
import os
import subprocess
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy/helm/tessera"
TESTS = ROOT / "deploy/helm/tests"
FULL_VALUES = CHART / "ci/full-values.yaml"
HELM = ROOT / "target/tools/bin/helm"
TESSERA = ROOT / "target/debug/tessera"
SCHEDULER = ROOT / "target/debug/tessera-scheduler"
RELEASE = "t"
NAMESPACE = "tessera-system"

# helm keeps caches and config in these; keep them out of $HOME.
HELM_HOME = ROOT / "target/tools/helm-home"


def missing_prerequisites():
    """What is not installed, each with how to get it."""
    missing = []
    if not HELM.exists():
        missing.append(f"{HELM} (run `make test-deps`: go install helm.sh/helm/v3/cmd/helm)")
    for binary, package in [(TESSERA, "tessera-agent"), (SCHEDULER, "tessera-scheduler")]:
        if not binary.exists():
            missing.append(f"{binary} (cargo build -p {package})")
    return missing


def helm(*args, check=True):
    """Runs helm; returns the CompletedProcess (stdout and stderr as text)."""
    env = dict(os.environ)
    for var, sub in [("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                     ("HELM_DATA_HOME", "data")]:
        env[var] = str(HELM_HOME / sub)
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env,
                          timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def template_args(values_files=(), sets=(), chart=CHART):
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


def render(values_files=(), sets=(), chart=CHART):
    """The manifests `helm template` renders, as a Manifests."""
    out = helm(*template_args(values_files, sets, chart)).stdout
    return Manifests([d for d in yaml.safe_load_all(out) if d])


def render_notes(values_files=(), sets=()):
    """NOTES.txt as `helm install` would print it. `helm template` leaves NOTES out and
    `helm install --dry-run` needs a cluster, so a copy of the chart renders it through
    `tpl` into a ConfigMap."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "tessera"
        subprocess.run(["cp", "-r", str(CHART), str(chart)], check=True)
        (chart / "notes-source.txt").write_text((CHART / "templates/NOTES.txt").read_text())
        (chart / "templates/zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
            "data:\n  notes: {{ tpl (.Files.Get \"notes-source.txt\") . | toJson }}\n")
        return render(values_files, sets, chart).get("ConfigMap", "rendered-notes")["data"]["notes"]


class Manifests:
    """Rendered resources, looked up by kind and name."""

    def __init__(self, docs):
        self.docs = docs

    def of_kind(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def find(self, kind, name):
        for d in self.docs:
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
        return None

    def get(self, kind, name):
        d = self.find(kind, name)
        if d is None:
            have = sorted(f"{x['kind']}/{x['metadata']['name']}" for x in self.docs)
            raise AssertionError(f"no {kind}/{name} rendered; have {have}")
        return d

    def one(self, kind):
        found = self.of_kind(kind)
        if len(found) != 1:
            raise AssertionError(f"expected one {kind}, rendered {len(found)}")
        return found[0]

    def secret_data(self, name):
        """A rendered Secret's data, decoded."""
        s = self.get("Secret", name)
        return {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}

    def agent(self):
        return self.get("DaemonSet", f"{RELEASE}-tessera-agent")

    def node(self):
        """The node DaemonSet: the FUSE keeper and containerd's configuration."""
        return self.get("DaemonSet", f"{RELEASE}-tessera-node")

    def scheduler(self):
        return self.get("StatefulSet", f"{RELEASE}-tessera-scheduler")

    def agent_config_text(self):
        return self.get("ConfigMap", f"{RELEASE}-tessera-agent")["data"]["agent.toml"]


def container(workload, name, init=False):
    spec = workload["spec"]["template"]["spec"]
    for c in spec.get("initContainers" if init else "containers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"{workload['metadata']['name']} has no container {name}")


def volume(workload, name):
    for v in workload["spec"]["template"]["spec"].get("volumes", []):
        if v["name"] == name:
            return v
    raise AssertionError(f"{workload['metadata']['name']} has no volume {name}")


def mount(c, volume_name):
    for m in c.get("volumeMounts", []):
        if m["name"] == volume_name:
            return m
    raise AssertionError(f"container {c['name']} does not mount {volume_name}")


def env_value(c, name):
    for e in c.get("env", []):
        if e["name"] == name:
            return e.get("value", e.get("valueFrom"))
    raise AssertionError(f"container {c['name']} has no env {name}")


def flag(args, name):
    """The value following `name` in an argument list."""
    if name not in args:
        raise AssertionError(f"{name} not in {args}")
    return args[args.index(name) + 1]


def dump(obj):
    return json.dumps(obj, indent=1, sort_keys=True)
