"""Runs the containers the chart renders with the real binaries, the way kubelet would
run them, minus the container runtime: the rendered command, arguments and
environment (field references resolved, $(VAR) expanded, the image's ENV first),
every volume filled from the rendered ConfigMaps and Secrets (or from Secrets the test
provides, standing in for cert-manager), the pod's user and groups, capabilities and
no_new_privs from its securityContext (setpriv), and a network namespace per pod:
agents on the node's, with the node IP, schedulers on their own, bridged to it, their
pod DNS names in the agent's /etc/hosts (a mount namespace of its own).

A container's paths are its volumes' mount paths; here each volume is a directory of
the test's, so every absolute path under a mount path, in arguments, environment and
the mounted config file, is rewritten to that directory. Nothing else is changed.

Needs root (namespaces, veth, setpriv) and iproute2, util-linux and curl.
"""

import base64
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from chart import ROOT, SCHEDULER, TESSERA

# Where the images put the binaries (checked against the Dockerfiles by the render
# tests) and what stands for them here.
BINARIES = {"/usr/local/bin/tessera": TESSERA, "/usr/local/bin/tessera-scheduler": SCHEDULER}
DOCKERFILES = {"/usr/local/bin/tessera": "tessera.Dockerfile",
               "/usr/local/bin/tessera-scheduler": "tessera-scheduler.Dockerfile"}

# A /24 of the benchmarking range, on namespaces only this test sees.
SUBNET = "198.19.250"
NODE_IP = f"{SUBNET}.1"
NODE_NAME = "node-1"


def run(*args, check=True, **kw):
    return subprocess.run([str(a) for a in args], check=check, capture_output=True, text=True, **kw)


def image_env(command0):
    """The ENV lines of the Dockerfile that builds the image holding `command0`."""
    env = {}
    text = (ROOT / "deploy/docker" / DOCKERFILES[command0]).read_text()
    for key, value in re.findall(r"^ENV (\w+)=(\S+)$", text, re.M):
        env[key] = value
    return env


class NetNs:
    """A network namespace held by a sleeping process (gone with it)."""

    def __init__(self):
        self.holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "3600"])
        own = os.readlink("/proc/self/ns/net")
        for _ in range(200):
            try:
                if os.readlink(f"/proc/{self.holder.pid}/ns/net") != own:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        else:
            raise AssertionError("unshare --net did not make a namespace")
        self.path = f"/proc/{self.holder.pid}/ns/net"
        self.ip("link", "set", "lo", "up")

    def enter(self):
        return ["nsenter", f"--net={self.path}", "--"]

    def ip(self, *args):
        return run(*self.enter(), "ip", *args)

    def close(self):
        self.holder.kill()
        self.holder.wait()


class Cluster:
    """One node (its network namespace and a bridge with the node IP) and pods beside it."""

    def __init__(self, workdir, manifests, provided_secrets):
        self.workdir = Path(workdir)
        self.workdir.chmod(0o755)  # non-root containers reach their volumes through it
        self.m = manifests
        self.provided = provided_secrets
        self.node = NetNs()
        self.node.ip("link", "add", "br0", "type", "bridge")
        self.node.ip("addr", "add", f"{NODE_IP}/24", "dev", "br0")
        self.node.ip("link", "set", "br0", "up")
        self.node_dir = self.workdir / "node"  # hostPath volumes live here
        self.netns = [self.node]
        self.processes = []
        self.hosts = {}  # DNS name -> IP, for the agent's /etc/hosts
        self.next_ip = 10

    def close(self):
        for p in self.processes:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in self.netns:
            ns.close()

    def pod_netns(self):
        """A namespace of a pod's own, on the node's bridge; returns it and its IP."""
        ns = NetNs()
        ip = f"{SUBNET}.{self.next_ip}"
        self.next_ip += 1
        a, b = f"tch{os.getpid() % 100000}p{self.next_ip}", f"tch{os.getpid() % 100000}n{self.next_ip}"
        run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        run("ip", "link", "set", a, "netns", ns.holder.pid)
        run("ip", "link", "set", b, "netns", self.node.holder.pid)
        self.node.ip("link", "set", b, "master", "br0", "up")
        ns.ip("addr", "add", f"{ip}/24", "dev", a)
        ns.ip("link", "set", a, "up")
        self.netns.append(ns)
        return ns, ip

    def host_path(self, path):
        d = self.node_dir / path.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        return d


class Pod:
    """One pod of a workload: its volumes as directories, its namespaces and identity."""

    def __init__(self, cluster, workload, name, ns, ip, fields):
        self.cluster = cluster
        self.workload = workload
        self.name = name
        self.spec = workload["spec"]["template"]["spec"]
        self.ns = ns
        self.ip = ip
        self.fields = fields
        self.dir = cluster.workdir / name
        self.volumes = {}
        for v in self.spec.get("volumes", []):
            self.volumes[v["name"]] = self._volume(v)
        for claim in workload["spec"].get("volumeClaimTemplates", []):
            self.volumes[claim["metadata"]["name"]] = self._scratch(claim["metadata"]["name"])

    def _scratch(self, name):
        d = self.dir / "volumes" / name
        d.mkdir(parents=True)
        group = self.spec.get("securityContext", {}).get("fsGroup")
        if group is not None:  # kubelet gives fsGroup the volume, setgid
            os.chown(d, 0, group)
            d.chmod(0o2775)
        return d

    def _volume(self, v):
        if "hostPath" in v:
            hp = v["hostPath"]
            if hp.get("type") == "CharDevice":
                return Path(hp["path"])  # the real device (/dev/fuse)
            return self.cluster.host_path(hp["path"])
        if "emptyDir" in v:
            return self._scratch(v["name"])
        d = self.dir / "volumes" / v["name"]
        d.mkdir(parents=True)
        if "configMap" in v:
            data = self.cluster.m.get("ConfigMap", v["configMap"]["name"])["data"]
            data = {k: s.encode() for k, s in data.items()}
            items = v["configMap"].get("items")
            mode = v["configMap"].get("defaultMode", 0o644)
        elif "secret" in v:
            name = v["secret"]["secretName"]
            rendered = self.cluster.m.find("Secret", name)
            if rendered is not None:
                data = {k: base64.b64decode(s) for k, s in rendered.get("data", {}).items()}
            elif name in self.cluster.provided:
                data = self.cluster.provided[name]
            else:
                raise AssertionError(f"{self.name}: Secret {name} is neither rendered nor provided")
            items = v["secret"].get("items")
            mode = v["secret"].get("defaultMode", 0o644)
        else:
            raise AssertionError(f"{self.name}: volume kind of {v} not simulated")
        for item in items or [{"key": k, "path": k} for k in data]:
            if item["key"] not in data:
                raise AssertionError(f"{self.name}: volume {v['name']} wants key {item['key']}, "
                                     f"which is not in {sorted(data)} (kubelet would not start the pod)")
            (d / item["path"]).write_bytes(data[item["key"]])
            (d / item["path"]).chmod(item.get("mode", mode))
            group = self.spec.get("securityContext", {}).get("fsGroup")
            if group is not None:
                os.chown(d / item["path"], 0, group)
        return d

    def container(self, name, init=False):
        for c in self.spec.get("initContainers" if init else "containers", []):
            if c["name"] == name:
                return Container(self, c)
        raise AssertionError(f"{self.name} has no container {name}")


class Container:
    def __init__(self, pod, spec):
        self.pod = pod
        self.spec = spec
        self.mounts = sorted(((m["mountPath"], pod.volumes[m["name"]]) for m in spec.get("volumeMounts", [])),
                             key=lambda x: -len(x[0]))
        self.env = self._env()
        for path, d in self.mounts:
            for cfg in d.glob("*.toml") if d.is_dir() and d.parent.name == "volumes" else []:
                cfg.write_text(self.remap_text(cfg.read_text()))

    def remap(self, path):
        """The test's directory for a path inside the container (unchanged if no volume holds it)."""
        for mount_path, d in self.mounts:
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                return str(d) + path[len(mount_path):]
        return path

    def remap_text(self, text):
        """Every quoted absolute path in a config file."""
        return re.sub(r'"(/[^"]*)"', lambda m: '"' + self.remap(m.group(1)) + '"', text)

    def expand(self, value, env):
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)

    def _env(self):
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.pod.dir / "home")}
        (self.pod.dir / "home").mkdir(exist_ok=True)
        env.update(image_env(self.spec["command"][0]))
        for e in self.spec.get("env", []):
            if "value" in e:
                env[e["name"]] = self.expand(e["value"], env)
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = self.pod.fields[field]
        return {k: self.remap(v) if v.startswith("/") else v for k, v in env.items()}

    def argv(self, command=None):
        command = list(command or self.spec["command"] + self.spec.get("args", []))
        binary = BINARIES[command[0]]
        return [str(binary)] + [self.remap(self.expand(a, self.env)) for a in command[1:]]

    def identity(self):
        """setpriv arguments for the pod's and the container's securityContext."""
        pod_sc = self.pod.spec.get("securityContext", {})
        sc = self.spec.get("securityContext", {})
        uid = sc.get("runAsUser", pod_sc.get("runAsUser", 0))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", 0))
        groups = [str(g) for g in [pod_sc.get("fsGroup")] if g is not None]
        args = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
        args += [f"--groups={','.join(groups)}"] if groups else ["--clear-groups"]
        if sc.get("privileged"):
            return args
        drop = sc.get("capabilities", {}).get("drop", [])
        add = sc.get("capabilities", {}).get("add", [])
        if "ALL" in drop:
            caps = ",".join(["-all"] + [f"+{c.lower()}" for c in add])
            args += [f"--inh-caps={caps}", f"--bounding-set={caps}"]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--no-new-privs"]
        return args

    def run_once(self, command=None, timeout=30):
        """Runs to completion (an init container, an exec probe)."""
        argv = [*self.identity(), "--", *self.argv(command)]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, etc_hosts=None):
        """Starts the container's process in the pod's network namespace."""
        log = open(self.pod.dir / f"{self.spec['name']}.log", "w")
        inner = [*self.identity(), "--", *self.argv()]
        if etc_hosts is not None:
            hosts = self.pod.dir / "etc-hosts"
            hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {n}\n" for n, ip in etc_hosts.items()))
            inner = ["unshare", "--mount", "--", "sh", "-c",
                     'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *inner]
        with log:
            p = subprocess.Popen([*self.pod.ns.enter(), *inner], env=self.env, stdout=log,
                                 stderr=subprocess.STDOUT)
        self.pod.cluster.processes.append(p)
        self.process = p
        self.log_path = Path(log.name)
        return p

    def log(self, tail=4000):
        """What the process printed (its last `tail` characters; None: all)."""
        text = self.log_path.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def port(self, name_or_number):
        if isinstance(name_or_number, int):
            return name_or_number
        for p in self.spec.get("ports", []):
            if p["name"] == name_or_number:
                return p["containerPort"]
        raise AssertionError(f"{self.spec['name']} has no port {name_or_number}")

    def probe(self, kind):
        """Runs one of the container's probes as kubelet would; returns (ok, detail)."""
        probe = self.spec.get(kind)
        if probe is None:
            raise AssertionError(f"{self.spec['name']} has no {kind}")
        if "exec" in probe:
            r = self.run_once(probe["exec"]["command"], timeout=probe.get("timeoutSeconds", 1) + 5)
            return r.returncode == 0, r.stdout + r.stderr
        get = probe["httpGet"]
        url = f"{get.get('scheme', 'HTTP').lower()}://{self.pod.ip}:{self.port(get['port'])}{get['path']}"
        # kubelet does not verify certificates; 200-399 is success.
        r = run(*self.pod.cluster.node.enter(), "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}",
                "--max-time", str(probe.get("timeoutSeconds", 1) + 1), url, check=False)
        return r.stdout.isdigit() and 200 <= int(r.stdout) < 400, f"{url}: {r.stdout} {r.stderr}"

    def wait_probe(self, kind, timeout=30):
        deadline = time.time() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.spec['name']} exited ({self.process.returncode}):\n{self.log()}")
            ok, detail = self.probe(kind)
            if ok:
                return detail
            if time.time() > deadline:
                raise AssertionError(f"{self.spec['name']}: {kind} still failing: {detail}\n{self.log()}")
            time.sleep(0.2)

    def stop(self, timeout):
        """SIGTERM, as kubelet sends it; returns the exit code (None: still running at timeout)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def prerequisites():
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, veth, setpriv)")
    for tool, package in [("unshare", "util-linux"), ("nsenter", "util-linux"), ("setpriv", "util-linux"),
                          ("ip", "iproute2"), ("curl", "curl"), ("openssl", "openssl")]:
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt-get install {package})")
    return missing
