"""The rendered chart run with the real binaries (podsim.py): the scheduler replicas and
an agent start from exactly what the chart renders, their probes pass, the agent
joins every replica with the token and (full values) TLS the chart wires up, the
mirror answers on the node's loopback only, /metrics takes the read-only token, the
containerd init container writes the hosts files, the layer store is mounted where
the chart says, and SIGTERM stops the agent cleanly within its grace period."""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
import unittest
from pathlib import Path

from chart import FULL_VALUES, NAMESPACE, missing_prerequisites, render
from podsim import NODE_IP, NODE_NAME, Cluster, Pod, prerequisites, run


def setUpModule():
    missing = missing_prerequisites() + prerequisites()
    if missing:
        raise AssertionError("missing test prerequisites:\n  " + "\n  ".join(missing))


def make_certs(d, sts, headless, service):
    """A throwaway CA, the scheduler's certificate (every replica's name, the Service
    the ServiceMonitor names, and 127.0.0.1 for port-forwarded admin calls, as
    values.yaml asks) and the agents' peer certificate."""
    d.mkdir()

    def openssl(*args):
        run("openssl", *args, cwd=d)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=tessera-chart-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", "ca.key", "-out", "ca.crt")

    def leaf(name, sans):
        (d / f"{name}.ext").write_text(
            f"subjectAltName={','.join(sans)}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl("x509", "-req", "-days", "2", "-CAcreateserial", "-in", f"{name}.csr", "-CA", "ca.crt",
                "-CAkey", "ca.key", "-extfile", f"{name}.ext", "-out", f"{name}.crt")
        return {"tls.crt": (d / f"{name}.crt").read_bytes(), "tls.key": (d / f"{name}.key").read_bytes()}

    scheduler = leaf("scheduler", [f"DNS:*.{headless}.{NAMESPACE}.svc.cluster.local",
                                   f"DNS:{service}.{NAMESPACE}.svc", "IP:127.0.0.1"])
    peer = leaf("peer", ["DNS:peers.tessera.internal"])
    return {"tessera-scheduler-tls": scheduler, "tessera-peer-tls": peer,
            "tessera-ca": {"ca.crt": (d / "ca.crt").read_bytes()}}


class Run:
    """A cluster of one node (the agent) and the scheduler's replicas, from one render."""

    values = ()
    replicas = 1
    tls = False

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="tessera-chart-"))
        cls.m = render(cls.values)
        cls.ds, cls.sts = cls.m.agent(), cls.m.scheduler()
        cls.headless = cls.sts["spec"]["serviceName"]
        cls.provided = make_certs(cls.tmp / "certs", cls.sts["metadata"]["name"], cls.headless,
                                  cls.sts["metadata"]["name"]) if cls.tls else {}
        cls.cluster = Cluster(cls.tmp, cls.m, cls.provided)
        try:
            cls.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls):
        cls.schedulers = []
        for i in range(cls.sts["spec"]["replicas"]):
            name = f"{cls.sts['metadata']['name']}-{i}"
            ns, ip = cls.cluster.pod_netns()
            pod = Pod(cls.cluster, cls.sts, name, ns, ip, {
                "status.podIP": ip, "metadata.name": name, "metadata.namespace": NAMESPACE,
                "spec.nodeName": NODE_NAME})
            cls.cluster.hosts[f"{name}.{cls.headless}.{NAMESPACE}.svc.cluster.local"] = ip
            c = pod.container("scheduler")
            c.start()
            cls.schedulers.append(c)
        cls.agent_pod = Pod(cls.cluster, cls.ds, "agent", cls.cluster.node, NODE_IP, {
            "status.hostIP": NODE_IP, "status.podIP": NODE_IP, "spec.nodeName": NODE_NAME,
            "metadata.name": "agent-x1", "metadata.namespace": NAMESPACE})
        # The node DaemonSet's pod (containerd's configuration, the FUSE keeper's
        # home) when the values have one; its init containers run first.
        node_ds = cls.m.find("DaemonSet", cls.ds["metadata"]["name"].replace("-agent", "-node"))
        pods = [cls.agent_pod]
        if node_ds is not None:
            pods.insert(0, Pod(cls.cluster, node_ds, "node", cls.cluster.node, NODE_IP, {
                "spec.nodeName": NODE_NAME, "metadata.namespace": NAMESPACE}))
        cls.init_runs = []
        for pod in pods:
            for init in pod.spec.get("initContainers", []):
                c = pod.container(init["name"], init=True)
                cls.prepare_init(c)
                cls.init_runs.append(c.run_once())
                cls.init_runs.append(c.run_once())  # a restarted pod runs it again
                cls.init = c
        cls.agent = cls.agent_pod.container("agent")
        cls.agent.start(etc_hosts=cls.cluster.hosts)
        for s in cls.schedulers:
            s.wait_probe("livenessProbe")
            s.wait_probe("readinessProbe")
        cls.agent.wait_probe("startupProbe")

    @classmethod
    def prepare_init(cls, c):
        """The node as containerd left it: a config naming certs.d, and a hosts file of
        someone else's for docker.io."""
        certs = Path(c.remap(c.spec["args"][c.spec["args"].index("--certs-dir") + 1]))
        config = Path(c.remap(c.spec["args"][c.spec["args"].index("--containerd-config") + 1]))
        # On a node certs.d has the same path inside and out; here it is a test dir.
        config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n'
                          f'  config_path = "{certs}"\n')
        (certs / "docker.io").mkdir(parents=True, exist_ok=True)
        (certs / "docker.io/hosts.toml").write_text('server = "https://registry-1.docker.io"\n# theirs\n')
        cls.certs = certs

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        if os.environ.get("TESSERA_KEEP_TEST_DIR"):
            print(f"kept {cls.tmp}")
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    # -- helpers

    def config(self):
        return tomllib.loads(self.agent_pod.volumes["config"].joinpath("agent.toml").read_text())

    def status(self):
        r = self.agent.run_once(["/usr/local/bin/tessera", "status", "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def admin_get(self, replica, path, token=None):
        """GET on a replica's admin API from the node, as Prometheus or an operator would."""
        s = self.schedulers[replica]
        port = s.port("admin")
        args = [*self.cluster.node.enter(), "curl", "-s", "-w", "\n%{http_code}", "--max-time", "5"]
        if self.tls:
            name = f"{self.sts['metadata']['name']}.{NAMESPACE}.svc"
            args += ["--cacert", str(self.tmp / "certs/ca.crt"), "--resolve", f"{name}:{port}:{s.pod.ip}"]
            url = f"https://{name}:{port}{path}"
        else:
            url = f"http://{s.pod.ip}:{port}{path}"
        if token is not None:
            args += ["-H", f"Authorization: Bearer {token}"]
        r = run(*args, url, check=False)
        body, _, code = r.stdout.rpartition("\n")
        return int(code or 0), body

    def token_file(self, pod_container, volume, key):
        return (pod_container.pod.volumes[volume] / key).read_text().strip()

    # -- tests

    def test_probes_pass(self):
        for s in self.schedulers:
            for kind in ["livenessProbe", "readinessProbe"]:
                ok, detail = s.probe(kind)
                self.assertTrue(ok, f"{s.pod.name} {kind}: {detail}")
        for kind in ["startupProbe", "livenessProbe", "readinessProbe"]:
            ok, detail = self.agent.probe(kind)
            self.assertTrue(ok, f"agent {kind}: {detail}")

    def test_agent_joins_every_replica(self):
        deadline = time.time() + 30
        while True:
            swarm = self.status().get("swarm") or {}
            if swarm.get("registered") and swarm.get("schedulers_registered") == self.replicas:
                break
            if time.time() > deadline:
                self.fail(f"agent not registered with {self.replicas} replicas: {swarm}\n{self.agent.log()}")
            time.sleep(0.3)
        self.assertEqual(swarm["schedulers"], self.replicas)
        self.assertEqual(swarm["host_id"], NODE_NAME)

    def test_every_replica_lists_the_node(self):
        self.test_agent_joins_every_replica()
        admin = self.token_file(self.schedulers[0], "admin-tokens", "admin-token")
        for i in range(self.replicas):
            code, body = self.admin_get(i, "/api/v1/hosts", admin)
            self.assertEqual(code, 200, body)
            hosts = json.loads(body)
            hosts = hosts.get("hosts", hosts) if isinstance(hosts, dict) else hosts
            (node,) = [h for h in hosts if h["id"] == NODE_NAME]
            self.assertEqual(node["address"], f"{NODE_IP}:{self.config()['p2p']['peer_listen'].rsplit(':', 1)[1]}")
            self.check_host(node)

    def check_host(self, node):
        pass

    def test_metrics_take_the_read_only_token(self):
        sms = [s for s in self.m.of_kind("ServiceMonitor") if s["metadata"]["name"] == self.sts["metadata"]["name"]]
        if sms:  # the token Prometheus is given
            cred = sms[0]["spec"]["endpoints"][0]["authorization"]["credentials"]
            token = self.m.secret_data(cred["name"])[cred["key"]]
        else:
            token = self.token_file(self.schedulers[0], "admin-tokens", "read-token")
        for i in range(self.replicas):
            code, body = self.admin_get(i, "/metrics", token)
            self.assertEqual(code, 200, body)
            self.assertIn("tessera_scheduler_", body)
            code, _ = self.admin_get(i, "/metrics")
            self.assertEqual(code, 401)
            code, _ = self.admin_get(i, "/metrics", "not-the-token")
            self.assertEqual(code, 401)
        # Read-only: it may not change anything.
        code, _ = self.admin_get(0, "/api/v1/stats", token)
        self.assertEqual(code, 200)

    def test_agent_metrics_on_the_node_ip(self):
        port = self.agent.port("metrics")
        r = run(*self.cluster.node.enter(), "curl", "-sf", "--max-time", "5", f"http://{NODE_IP}:{port}/metrics")
        self.assertIn("tessera_agent_", r.stdout)

    def test_mirror_answers_on_loopback_only(self):
        listen = self.config()["mirror"]["listen"]
        self.assertTrue(listen.startswith("127.0.0.1:"), listen)
        port = listen.rsplit(":", 1)[1]
        r = run(*self.cluster.node.enter(), "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                "--max-time", "5", f"http://127.0.0.1:{port}/v2/", check=False)
        self.assertEqual(r.returncode, 0, f"the mirror does not answer on {listen}: {r.stderr}")
        self.assertRegex(r.stdout, r"^[2-5][0-9][0-9]$")
        r = run(*self.cluster.node.enter(), "curl", "-s", "--max-time", "5", f"http://{NODE_IP}:{port}/v2/",
                check=False)
        self.assertEqual(r.returncode, 7, "the mirror must not be reachable on the node's IP")

    def test_zz_sigterm_stops_the_agent_within_its_grace_period(self):
        """Runs last (unittest sorts by name): the agent is gone afterwards."""
        grace = self.ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        code = self.agent.stop(grace)
        self.assertEqual(code, 0, f"exit {code} after SIGTERM:\n{self.agent.log()}")
        self.assertIn("shutting down, unmounting", self.agent.log(tail=None))
        config = self.config()
        self.assertFalse(Path(config["socket"]).exists(), "the socket is removed")
        for section, key in [("snapshotter", "socket"), ("cri", "listen")]:
            if section in config:
                self.assertFalse(Path(config[section][key]).exists(), f"{section}.{key} is removed")
        if "--store-root" in self.agent.spec["args"]:
            self.assertIn("layer store unmounted", self.agent.log(tail=None))


class Defaults(Run, unittest.TestCase):
    """Default values: one replica, plain HTTP, no containerd init container."""

    def test_scheduler_state_dir_is_written_by_the_non_root_user(self):
        state = self.schedulers[0].pod.volumes["state"]
        self.assertTrue(any(state.iterdir()), "sled wrote nothing to --state-dir")
        for p in state.rglob("*"):
            self.assertEqual(p.stat().st_uid, 65532, p)


class FullValues(Run, unittest.TestCase):
    """ci/full-values.yaml: 3 replicas, TLS for the scheduler and peers, registry
    credentials, the containerd init container, the layer store."""

    values = (FULL_VALUES,)
    replicas = 3
    tls = True

    def check_host(self, node):
        # --max-uploads from agent.extraArgs overrides the config's 64.
        self.assertEqual(node["max_uploads"], 48)
        self.assertIn("eu-1a", node["labels"].values())

    def test_scheduler_speaks_only_tls(self):
        s = self.schedulers[0]
        r = run(*self.cluster.node.enter(), "curl", "-s", "--max-time", "5",
                f"http://{s.pod.ip}:{s.port('admin')}/healthz", check=False)
        self.assertNotEqual(r.stdout, "ok\n")

    def test_containerd_hosts_files(self):
        first, second = self.init_runs
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn("names", first.stdout)
        self.assertIn("no restart needed", first.stdout)
        self.assertIn("hosts.toml.tessera-backup", first.stdout)
        self.assertEqual(len(re.findall(r"\bunchanged\b", second.stdout)), 4, second.stdout)
        mirror = "http://" + self.config()["mirror"]["listen"]
        for registry in ["docker.io", "registry.example.com", "registry.internal:5000", "_default"]:
            text = (self.certs / registry / "hosts.toml").read_text()
            self.assertIn(f'[host."{mirror}"]', text)
        self.assertIn('server = "http://registry.internal:5000"',
                      (self.certs / "registry.internal:5000/hosts.toml").read_text())
        self.assertIn("# theirs", (self.certs / "docker.io/hosts.toml.tessera-backup").read_text())

    def test_cri_proxy_listens_beside_the_agent(self):
        """The socket the kubelet's --image-service-endpoint names accepts connections
        although no containerd runs here (the proxy dials it at the first call);
        containerd's socket and the credentials file are in the node's volumes."""
        config = self.config()
        deadline = time.time() + 10
        while True:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                try:
                    s.connect(config["cri"]["listen"])
                    break
                except OSError as e:
                    if time.time() > deadline:
                        self.fail(f"the CRI proxy does not answer on {config['cri']['listen']}: {e}\n"
                                  f"{self.agent.log()}")
            time.sleep(0.2)
        self.assertIn("CRI image service proxy ready", self.agent.log(tail=None))
        volumes = self.agent_pod.volumes
        self.assertEqual(Path(config["cri"]["containerd"]).parent, volumes["containerd-socket-dir"])
        self.assertEqual(Path(config["cri"]["credentials_file"]).parent, volumes["snapshotter-root"])

    def test_layer_store_is_mounted_at_its_volume(self):
        """`--store-root` from the rendered args: the agent mounts the store (a FUSE
        mount, fuse.tessera) on the layer-store volume, in the pod's mount namespace
        (Bidirectional propagation, which carries it to the node, is the container
        runtime's and not simulated here), and answers "not here" for a name that is no
        image reference, as containers/storage expects of a store without the layer."""
        root = os.path.realpath(self.agent_pod.volumes["layer-store"])
        self.assertEqual(self.agent.argv()[self.agent.argv().index("--store-root") + 1],
                         str(self.agent_pod.volumes["layer-store"]))
        pid = self.agent.process.pid
        deadline = time.time() + 10
        while True:
            mounts = [line.split(" - ")[1].split()[0]
                      for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                      if line.split()[4] == root]
            if "fuse.tessera" in mounts:
                break
            if time.time() > deadline:
                self.fail(f"no fuse.tessera mount at {root} in the agent's namespace: {mounts}\n"
                          f"{self.agent.log()}")
            time.sleep(0.2)
        inside = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--"]
        r = run(*inside, "ls", "-a", root, check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run(*inside, "stat", f"{root}/not-a-reference!/sha256:00/diff", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("No such file or directory", r.stderr)
        # The cache (the images' trees are mounted under it) is the node's path in the pod.
        self.assertEqual(self.config()["cache_dir"], str(self.agent_pod.volumes["cache"]))

    def test_registry_credentials_reach_the_agent(self):
        auth_file = Path(self.config()["registry"]["auth_file"])
        self.assertIn("registry.example.com", json.loads(auth_file.read_text())["auths"])


if __name__ == "__main__":
    unittest.main()
