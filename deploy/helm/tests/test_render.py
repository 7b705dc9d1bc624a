"""The chart as helm renders it: lint, the Kubernetes schemas, the values schema, and
the properties the deployment depends on (FUSE privileges, the cache on the node, the
mirror on loopback, probes, tokens, the scheduler replica list)."""

import re
import subprocess
import tempfile
import tomllib
import unittest
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

from chart import (CHART, FULL_VALUES, NAMESPACE, RELEASE, SCHEDULER, TESSERA, TESTS,
                   container, dump, env_value, flag, helm, missing_prerequisites, mount,
                   render, render_notes, template_args, volume)

# The oldest and the newest Kubernetes the chart is checked against.
KUBERNETES_VERSIONS = ["1.29", "1.37"]

# ServiceMonitor is a CRD (Prometheus Operator), not in the Kubernetes schemas: the
# fields the chart writes are checked against this subset of its OpenAPI schema.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace", "labels"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object"}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["port", "path"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                        "scrapeTimeout": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "authorization": {
                            "type": "object", "additionalProperties": False,
                            "properties": {
                                "type": {"type": "string"},
                                "credentials": {"type": "object", "additionalProperties": False,
                                                "required": ["key"],
                                                "properties": {"name": {"type": "string"}, "key": {"type": "string"}}}}},
                        "tlsConfig": {
                            "type": "object", "additionalProperties": False,
                            "properties": {
                                "serverName": {"type": "string"},
                                "ca": {"type": "object", "additionalProperties": False, "properties": {
                                    "secret": {"type": "object", "additionalProperties": False,
                                               "required": ["key"],
                                               "properties": {"name": {"type": "string"}, "key": {"type": "string"}}}}}}},
                        "relabelings": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"sourceLabels": {"type": "array", "items": {"type": "string"}},
                                           "targetLabel": {"type": "string"}}}},
                    }}},
            },
        },
    },
}

# Free-form Kubernetes objects given as defaults in values.yaml: the comment above the
# parent key documents them, not one per field.
FREE_FORM = {"resources", "podSecurityContext", "securityContext"}


def setUpModule():
    missing = missing_prerequisites()
    if missing:
        raise AssertionError("missing test prerequisites:\n  " + "\n  ".join(missing))


def validate_kubernetes(testcase, manifests):
    """Each resource against the Kubernetes schemas, strictly (unknown fields fail)."""
    for doc in manifests.docs:
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
            continue
        for version in KUBERNETES_VERSIONS:
            with testcase.subTest(resource=what, kubernetes=version):
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path = ".".join(str(p) for p in e.path)
                    testcase.fail(f"{what} against Kubernetes {version}: {path}: {e.message}")
                except kubernetes_validate.utils.SchemaNotFoundError as e:
                    testcase.fail(f"{what}: {e.message}")


class Defaults(unittest.TestCase):
    """The chart with its default values."""

    @classmethod
    def setUpClass(cls):
        cls.m = render()

    def test_lint(self):
        out = helm("lint", "--strict", str(CHART)).stdout
        self.assertIn("0 chart(s) failed", out)

    def test_kubernetes_schemas(self):
        validate_kubernetes(self, self.m)

    def test_what_is_rendered(self):
        kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in self.m.docs)
        self.assertEqual(kinds, sorted([
            "ConfigMap/t-tessera-agent",
            "DaemonSet/t-tessera-agent",
            "Secret/t-tessera-admin-tokens",
            "Secret/t-tessera-p2p-token",
            "Service/t-tessera-agent-metrics",
            "Service/t-tessera-scheduler",
            "Service/t-tessera-scheduler-headless",
            "ServiceAccount/t-tessera-agent",
            "ServiceAccount/t-tessera-scheduler",
            "StatefulSet/t-tessera-scheduler",
        ]))
        for doc in self.m.docs:
            labels = doc["metadata"]["labels"]
            for key in ["app.kubernetes.io/name", "app.kubernetes.io/instance",
                        "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                        "helm.sh/chart"]:
                self.assertIn(key, labels, f"{doc['kind']}/{doc['metadata']['name']}")
            self.assertEqual(doc["metadata"]["namespace"], NAMESPACE)

    def test_images_default_to_app_version(self):
        app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        self.assertEqual(container(self.m.agent(), "agent")["image"], f"tessera:{app_version}")
        self.assertEqual(container(self.m.scheduler(), "scheduler")["image"],
                         f"tessera-scheduler:{app_version}")

    def test_commands_are_where_the_images_put_the_binaries(self):
        for dockerfile, workload, name, binary in [
            ("tessera.Dockerfile", self.m.agent(), "agent", "/usr/local/bin/tessera"),
            ("tessera-scheduler.Dockerfile", self.m.scheduler(), "scheduler",
             "/usr/local/bin/tessera-scheduler"),
        ]:
            text = (CHART.parents[2] / "deploy/docker" / dockerfile).read_text()
            self.assertRegex(text, rf"COPY --from=build \S+ {re.escape(binary)}\n")
            self.assertEqual(container(workload, name)["command"], [binary])

    def test_no_containerd_init_container_unless_asked(self):
        spec = self.m.agent()["spec"]["template"]["spec"]
        self.assertNotIn("initContainers", spec)
        self.assertNotIn("containerd-certs", [v["name"] for v in spec["volumes"]])

    def test_no_snapshotter_unless_asked(self):
        spec = self.m.agent()["spec"]["template"]["spec"]
        self.assertEqual([c["name"] for c in spec["containers"]], ["agent"])
        self.assertNotIn("snapshotter-root", [v["name"] for v in spec["volumes"]])
        self.assertNotIn("snapshotter", tomllib.loads(self.m.agent_config_text()))

    def test_no_cri_proxy_unless_asked(self):
        spec = self.m.agent()["spec"]["template"]["spec"]
        self.assertNotIn("containerd-socket-dir", [v["name"] for v in spec["volumes"]])
        config = tomllib.loads(self.m.agent_config_text())
        self.assertNotIn("cri", config)
        # The mirror answers from its last known answers only when asked to.
        self.assertEqual(config["mirror"]["last_known_secs"], 0)
        notes = render_notes()
        self.assertNotIn("image-service-endpoint", notes)
        self.assertNotIn("lastKnownSecs", notes)

    def test_no_layer_store_unless_asked(self):
        agent = self.m.agent()
        c = container(agent, "agent")
        self.assertNotIn("--store-root", c["args"])
        self.assertNotIn("layer-store", [v["name"] for v in agent["spec"]["template"]["spec"]["volumes"]])
        self.assertNotIn("layer-store", [m["name"] for m in c["volumeMounts"]])
        # The cache at its fixed path in the pod, without propagation, as before.
        self.assertEqual(mount(c, "cache"), {"name": "cache", "mountPath": "/var/lib/tessera/cache"})
        self.assertNotIn("store_root", tomllib.loads(self.m.agent_config_text()))
        self.assertNotIn("additionallayerstores", render_notes())

    def test_one_replica_in_the_agent_config(self):
        config = tomllib.loads(self.m.agent_config_text())
        self.assertEqual(config["p2p"]["scheduler"],
                         "http://t-tessera-scheduler-0.t-tessera-scheduler-headless."
                         "tessera-system.svc.cluster.local:7080")

    def test_scheduler_state_is_an_empty_dir_without_persistence(self):
        sts = self.m.scheduler()
        self.assertNotIn("volumeClaimTemplates", sts["spec"])
        self.assertEqual(volume(sts, "state"), {"name": "state", "emptyDir": {}})

    def test_tokens_are_generated(self):
        p2p = self.m.secret_data("t-tessera-p2p-token")["token"]
        admin = self.m.secret_data("t-tessera-admin-tokens")
        tokens = [p2p, admin["admin-token"], admin["read-token"]]
        for t in tokens:
            self.assertRegex(t, r"^[A-Za-z0-9]{48}$")
        self.assertEqual(len(set(tokens)), 3, "the three tokens must differ")
        # A new render draws new ones (with a cluster, `lookup` keeps the existing ones).
        again = render().secret_data("t-tessera-p2p-token")["token"]
        self.assertNotEqual(p2p, again)

    def test_either_component_alone(self):
        agents_only = render(sets=["scheduler.enabled=false", "agent.p2p.enabled=false"])
        self.assertEqual(sorted({d["kind"] for d in agents_only.docs}),
                         ["ConfigMap", "DaemonSet", "Secret", "Service", "ServiceAccount"])
        validate_kubernetes(self, agents_only)
        scheduler_only = render(sets=["agent.enabled=false"])
        self.assertEqual(sorted({d["kind"] for d in scheduler_only.docs}),
                         ["Secret", "Service", "ServiceAccount", "StatefulSet"])
        validate_kubernetes(self, scheduler_only)

    def test_notes_tell_how_to_reach_the_admin_api(self):
        notes = render_notes()
        self.assertIn("kubectl -n tessera-system port-forward svc/t-tessera-scheduler 7090:7090", notes)
        self.assertIn("kubectl -n tessera-system get secret t-tessera-admin-tokens", notes)
        self.assertIn("-o jsonpath='{.data.admin-token}' | base64 -d > admin-token", notes)
        self.assertIn("tessera-scheduler admin --url http://127.0.0.1:7090 --token-file ./admin-token hosts", notes)
        self.assertIn("exec POD -c agent -- tessera status", notes)
        self.assertNotIn("for i in", notes)  # one replica: nothing to repeat per replica
        many = render_notes(sets=["scheduler.replicas=3"])
        self.assertIn("for i in $(seq 0 2)", many)
        self.assertIn("kubectl -n tessera-system exec t-tessera-scheduler-$i -- tessera-scheduler admin", many)


class FullValues(unittest.TestCase):
    """The chart with every option on (ci/full-values.yaml)."""

    @classmethod
    def setUpClass(cls):
        cls.m = render([FULL_VALUES])
        cls.agent = cls.m.agent()
        cls.agent_c = container(cls.agent, "agent")
        cls.agent_pod = cls.agent["spec"]["template"]["spec"]
        cls.node = cls.m.node()
        cls.sts = cls.m.scheduler()
        cls.sched_c = container(cls.sts, "scheduler")
        cls.config = tomllib.loads(cls.m.agent_config_text())

    def test_lint_strict(self):
        out = helm("lint", "--strict", "-f", str(FULL_VALUES), str(CHART)).stdout
        self.assertIn("0 chart(s) failed", out)

    def test_kubernetes_schemas(self):
        validate_kubernetes(self, self.m)

    def test_the_schema_check_can_fail(self):
        """An unknown field and a wrong type are caught by the check above."""
        bad = yaml.safe_load(yaml.safe_dump(self.agent))
        bad["spec"]["template"]["spec"]["hostNetwrk"] = True
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)
        bad = yaml.safe_load(yaml.safe_dump(self.sts))
        bad["spec"]["replicas"] = "3"
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)
        sm = yaml.safe_load(yaml.safe_dump(self.m.of_kind("ServiceMonitor")[0]))
        sm["spec"]["endpoints"][0]["bearerTokenSecrt"] = {}
        with self.assertRaises(jsonschema.ValidationError):
            jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)

    def test_fuse_privileges(self):
        sc = self.agent_c["securityContext"]
        self.assertTrue(sc["privileged"], "Bidirectional propagation and FUSE need it")
        self.assertIn("SYS_ADMIN", sc["capabilities"]["add"])
        self.assertEqual(volume(self.agent, "dev-fuse")["hostPath"],
                         {"path": "/dev/fuse", "type": "CharDevice"})
        self.assertEqual(mount(self.agent_c, "dev-fuse")["mountPath"], "/dev/fuse")

    def test_cache_on_a_host_path_with_the_capacity_in_the_config(self):
        self.assertEqual(volume(self.agent, "cache")["hostPath"],
                         {"path": "/mnt/nvme/tessera-cache", "type": "DirectoryOrCreate"})
        cache_mount = mount(self.agent_c, "cache")["mountPath"]
        self.assertEqual(self.config["cache_dir"], cache_mount)
        self.assertEqual(env_value(self.agent_c, "TESSERA_CACHE_DIR"), cache_mount)
        self.assertEqual(self.config["cache_capacity"], "50G")

    def test_mount_root_propagates_both_ways(self):
        m = mount(self.agent_c, "mount-root")
        self.assertEqual(m["mountPropagation"], "Bidirectional")
        # The same path inside and out: clients name mount points by their node path.
        self.assertEqual(m["mountPath"], "/var/lib/tessera/mnt")
        self.assertEqual(volume(self.agent, "mount-root")["hostPath"]["path"], "/var/lib/tessera/mnt")

    def test_host_network_and_the_mirror_on_loopback(self):
        self.assertTrue(self.agent_pod["hostNetwork"])
        self.assertEqual(self.agent_pod["dnsPolicy"], "ClusterFirstWithHostNet")
        self.assertEqual(self.config["mirror"]["listen"], "127.0.0.1:7082")
        self.assertEqual(self.config["mirror"]["default_registry"], "registry.example.com")
        # The socket is on the node, where `tessera mount` on the node finds it.
        self.assertEqual(self.config["socket"], "/run/tessera/agent.sock")
        self.assertEqual(volume(self.agent, "socket-dir")["hostPath"]["path"], "/run/tessera")
        self.assertEqual(env_value(self.agent_c, "TESSERA_SOCKET"), "/run/tessera/agent.sock")

    def test_peers_and_metrics_on_the_node_ip(self):
        self.assertEqual(env_value(self.agent_c, "HOST_IP"), {"fieldRef": {"fieldPath": "status.hostIP"}})
        self.assertEqual(env_value(self.agent_c, "TESSERA_ADVERTISE"), "$(HOST_IP):7081")
        self.assertEqual(env_value(self.agent_c, "TESSERA_METRICS_LISTEN"), "$(HOST_IP):9464")
        self.assertEqual(env_value(self.agent_c, "TESSERA_HOST_ID"), "$(NODE_NAME)")
        self.assertEqual(self.config["p2p"]["peer_listen"], "0.0.0.0:7081")
        ipv6 = render([FULL_VALUES], ["agent.p2p.ipFamily=IPv6"])
        c = container(ipv6.agent(), "agent")
        self.assertEqual(env_value(c, "TESSERA_ADVERTISE"), "[$(HOST_IP)]:7081")
        self.assertEqual(tomllib.loads(ipv6.agent_config_text())["p2p"]["peer_listen"], "[::]:7081")

    def test_probes(self):
        for probe in ["startupProbe", "livenessProbe"]:
            self.assertEqual(self.agent_c[probe]["httpGet"], {"path": "/healthz", "port": "metrics"})
        self.assertEqual(self.agent_c["readinessProbe"]["exec"]["command"],
                         ["/usr/local/bin/tessera", "status", "--json"])
        self.assertEqual(self.agent_c["startupProbe"]["failureThreshold"], 120)
        self.assertEqual(self.sched_c["livenessProbe"]["httpGet"],
                         {"path": "/healthz", "port": "admin", "scheme": "HTTPS"})
        self.assertEqual(self.sched_c["readinessProbe"]["httpGet"],
                         {"path": "/readyz", "port": "admin", "scheme": "HTTPS"})
        ports = {p["name"]: p["containerPort"] for p in self.sched_c["ports"]}
        self.assertEqual(ports, {"grpc": 7080, "admin": 7090})
        self.assertEqual(flag(self.sched_c["args"], "--admin-listen"), "0.0.0.0:7090")

    def test_graceful_termination(self):
        self.assertEqual(self.agent_pod["terminationGracePeriodSeconds"], 90)
        self.assertEqual(self.config["shutdown_grace_secs"], 20)
        self.assertEqual(self.config["passthrough"], False)
        self.assertEqual(self.config["scrub"], {"bytes_per_sec": "64M", "every_hours": 6})
        # The defaults leave the agent time to unmount after its grace.
        defaults = render()
        grace = tomllib.loads(defaults.agent_config_text())["shutdown_grace_secs"]
        pod = defaults.agent()["spec"]["template"]["spec"]
        self.assertGreaterEqual(pod["terminationGracePeriodSeconds"], grace + 15)
        self.assertEqual(self.agent["spec"]["updateStrategy"],
                         {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}})
        ondelete = render([FULL_VALUES], ["agent.updateStrategy.type=OnDelete"]).agent()
        self.assertEqual(ondelete["spec"]["updateStrategy"], {"type": "OnDelete"})

    def test_scheduling_options(self):
        self.assertEqual(self.agent_pod["priorityClassName"], "system-node-critical")
        self.assertEqual(self.agent_pod["tolerations"], [{"operator": "Exists"}])
        self.assertEqual(self.agent_pod["nodeSelector"], {"kubernetes.io/os": "linux"})
        self.assertIn("nodeAffinity", self.agent_pod["affinity"])
        self.assertEqual(self.agent_c["resources"]["limits"], {"cpu": "2"})
        pod = self.sts["spec"]["template"]["spec"]
        self.assertEqual(pod["priorityClassName"], "system-cluster-critical")
        self.assertEqual(pod["tolerations"][0]["key"], "node-role.kubernetes.io/control-plane")
        self.assertIn("requiredDuringSchedulingIgnoredDuringExecution", pod["affinity"]["podAntiAffinity"])
        self.assertEqual(self.sched_c["resources"]["limits"], {"memory": "1Gi"})
        self.assertEqual(self.m.get("PodDisruptionBudget", "t-tessera-scheduler")["spec"]["maxUnavailable"], 1)
        self.assertEqual([s["name"] for s in pod["imagePullSecrets"]], ["regcred"])
        self.assertEqual(self.agent["spec"]["template"]["metadata"]["labels"]["tier"], "node")
        self.assertEqual(self.agent["metadata"]["labels"]["team"], "platform")

    def test_scheduler_runs_unprivileged(self):
        pod = self.sts["spec"]["template"]["spec"]
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertEqual(pod["securityContext"]["runAsUser"], 65532)
        sc = self.sched_c["securityContext"]
        self.assertTrue(sc["readOnlyRootFilesystem"])
        self.assertFalse(sc["allowPrivilegeEscalation"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        self.assertFalse(pod["automountServiceAccountToken"])
        self.assertFalse(self.agent_pod["automountServiceAccountToken"])
        # Neither needs the Kubernetes API.
        for kind in ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]:
            self.assertEqual(self.m.of_kind(kind), [])

    def test_persistence_claims_the_state_dir(self):
        (claim,) = self.sts["spec"]["volumeClaimTemplates"]
        self.assertEqual(claim["metadata"]["name"], "state")
        self.assertEqual(claim["spec"]["storageClassName"], "fast-ssd")
        self.assertEqual(claim["spec"]["resources"]["requests"]["storage"], "2Gi")
        volumes = [v["name"] for v in self.sts["spec"]["template"]["spec"]["volumes"]]
        self.assertNotIn("state", volumes, "the claim, not an emptyDir")
        self.assertEqual(mount(self.sched_c, "state")["mountPath"], flag(self.sched_c["args"], "--state-dir"))

    def test_replica_list_matches_the_statefulset(self):
        """3 replicas: the agents list 3 URLs, one per StatefulSet pod DNS name."""
        self.assertEqual(self.sts["spec"]["replicas"], 3)
        headless = self.m.get("Service", self.sts["spec"]["serviceName"])
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertEqual(headless["spec"]["selector"], self.sts["spec"]["selector"]["matchLabels"])
        grpc = {p["name"]: p for p in self.sched_c["ports"]}["grpc"]["containerPort"]
        self.assertIn({"name": "grpc", "port": grpc, "targetPort": "grpc", "protocol": "TCP"},
                      headless["spec"]["ports"])
        self.assertEqual(flag(self.sched_c["args"], "--listen"), f"0.0.0.0:{grpc}")
        urls = self.config["p2p"]["scheduler"].split(",")
        expected = [
            f"https://{self.sts['metadata']['name']}-{i}.{headless['metadata']['name']}."
            f"{NAMESPACE}.svc.cluster.local:{grpc}" for i in range(3)
        ]
        self.assertEqual(urls, expected)
        self.assertTrue(self.config["p2p"]["enabled"])

    def test_external_scheduler(self):
        m = render(sets=["scheduler.enabled=false",
                         "agent.p2p.schedulerURLs={http://a:7080,http://b:7080}"])
        self.assertIsNone(m.find("StatefulSet", "t-tessera-scheduler"))
        self.assertIsNone(m.find("Secret", "t-tessera-admin-tokens"))
        config = tomllib.loads(m.agent_config_text())
        self.assertEqual(config["p2p"]["scheduler"], "http://a:7080,http://b:7080")
        off = tomllib.loads(render(sets=["scheduler.enabled=false", "agent.p2p.enabled=false"])
                            .agent_config_text())
        self.assertFalse(off["p2p"]["enabled"])
        self.assertNotIn("scheduler", off["p2p"])

    def test_tokens_given_are_used_and_each_workload_mounts_its_own(self):
        self.assertEqual(self.m.secret_data("t-tessera-p2p-token"),
                         {"token": "ci-p2p-token-0123456789abcdef"})
        self.assertEqual(self.m.secret_data("t-tessera-admin-tokens"),
                         {"admin-token": "ci-admin-token-0123456789abcdef",
                          "read-token": "ci-read-token-0123456789abcdef"})
        # The agent: the P2P token only, where its config says.
        agent_secrets = {v["secret"]["secretName"] for v in self.agent_pod["volumes"] if "secret" in v}
        self.assertIn("t-tessera-p2p-token", agent_secrets)
        self.assertNotIn("t-tessera-admin-tokens", agent_secrets, "nodes must not hold admin tokens")
        p2p = volume(self.agent, "p2p-token")["secret"]
        self.assertEqual(p2p["items"], [{"key": "token", "path": "token"}])
        self.assertEqual(self.config["p2p"]["token_file"], mount(self.agent_c, "p2p-token")["mountPath"] + "/token")
        # The scheduler: the same P2P token, and the admin tokens, where its flags say.
        self.assertEqual(volume(self.sts, "p2p-token")["secret"]["secretName"], "t-tessera-p2p-token")
        admin = volume(self.sts, "admin-tokens")["secret"]
        self.assertEqual(admin["secretName"], "t-tessera-admin-tokens")
        admin_dir = mount(self.sched_c, "admin-tokens")["mountPath"]
        self.assertEqual(flag(self.sched_c["args"], "--token-file"),
                         mount(self.sched_c, "p2p-token")["mountPath"] + "/token")
        self.assertEqual(flag(self.sched_c["args"], "--admin-token-file"), admin_dir + "/admin-token")
        self.assertEqual(flag(self.sched_c["args"], "--admin-read-token-file"), admin_dir + "/read-token")
        # Token files must follow Secret updates (rotation without restarts): no subPath.
        for c in [self.agent_c, self.sched_c]:
            for m in c["volumeMounts"]:
                self.assertNotIn("subPath", m, f"{c['name']}: {m['name']}")

    def test_existing_secrets(self):
        m = render([FULL_VALUES], [
            "auth.p2p.existingSecret=mine-p2p", "auth.p2p.existingSecretKey=k",
            "auth.admin.existingSecret=mine-admin", "auth.admin.existingSecretAdminKey=a",
            "auth.admin.existingSecretReadKey=r",
            "registryCredentials.existingSecret=mine-registry",
        ])
        self.assertEqual(m.of_kind("Secret"), [])
        self.assertEqual(volume(m.agent(), "p2p-token")["secret"],
                         {"secretName": "mine-p2p", "items": [{"key": "k", "path": "token"}]})
        self.assertEqual(volume(m.scheduler(), "admin-tokens")["secret"]["items"],
                         [{"key": "a", "path": "admin-token"}, {"key": "r", "path": "read-token"}])
        self.assertEqual(volume(m.agent(), "registry-credentials")["secret"],
                         {"secretName": "mine-registry",
                          "items": [{"key": ".dockerconfigjson", "path": "config.json"}]})
        (sm,) = [s for s in m.of_kind("ServiceMonitor") if "scheduler" in s["metadata"]["name"]]
        self.assertEqual(sm["spec"]["endpoints"][0]["authorization"]["credentials"],
                         {"name": "mine-admin", "key": "r"})
        # An existing registry Secret's content is unknown: no checksum of it.
        self.assertNotIn("checksum/registry-credentials", m.agent()["spec"]["template"]["metadata"]["annotations"])

    def test_registry_credentials_where_the_agent_reads_them(self):
        s = self.m.get("Secret", "t-tessera-registry")
        self.assertEqual(s["type"], "kubernetes.io/dockerconfigjson")
        data = self.m.secret_data("t-tessera-registry")[".dockerconfigjson"]
        self.assertIn("registry.example.com", data)
        path = mount(self.agent_c, "registry-credentials")["mountPath"] + "/config.json"
        self.assertEqual(self.config["registry"]["auth_file"], path)
        self.assertEqual(self.config["registry"]["insecure"], ["registry.internal:5000"])

    def test_tls(self):
        self.assertEqual(flag(self.sched_c["args"], "--tls-cert"), "/etc/tessera/tls/scheduler/tls.crt")
        self.assertEqual(flag(self.sched_c["args"], "--tls-key"), "/etc/tessera/tls/scheduler/tls.key")
        self.assertEqual(volume(self.sts, "tls")["secret"]["secretName"], "tessera-scheduler-tls")
        self.assertEqual(self.config["p2p"]["tls_ca"], mount(self.agent_c, "ca")["mountPath"] + "/ca.crt")
        self.assertEqual(volume(self.agent, "ca")["secret"],
                         {"secretName": "tessera-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]})
        self.assertEqual(self.config["p2p"]["tls_cert"], mount(self.agent_c, "peer-tls")["mountPath"] + "/tls.crt")
        self.assertEqual(self.config["p2p"]["tls_server_name"], "peers.tessera.internal")
        # The agents never mount the scheduler's key.
        self.assertNotIn("tessera-scheduler-tls",
                         [v.get("secret", {}).get("secretName") for v in self.agent_pod["volumes"]])

    def test_containerd_init_container(self):
        init = container(self.node, "containerd-config", init=True)
        self.assertEqual(init["command"], ["/usr/local/bin/tessera"])
        args = init["args"]
        self.assertEqual(args[0], "containerd-config")
        registries = [args[i + 1] for i, a in enumerate(args) if a == "--registry"]
        self.assertEqual(registries, ["docker.io", "registry.example.com", "registry.internal:5000"])
        self.assertIn("--all", args)
        self.assertEqual(flag(args, "--insecure"), "registry.internal:5000")
        self.assertEqual(flag(args, "--mirror"), "http://" + self.config["mirror"]["listen"])
        self.assertNotIn("--undo", args)
        # certs.d at the node's own path (the command compares it with config_path).
        certs = volume(self.node, "containerd-certs")["hostPath"]
        self.assertEqual(certs, {"path": "/etc/containerd/certs.d", "type": "DirectoryOrCreate"})
        self.assertEqual(mount(init, "containerd-certs")["mountPath"], certs["path"])
        self.assertEqual(flag(args, "--certs-dir"), certs["path"])
        # containerd's config: its directory never created; writable here only because
        # configureSnapshotter edits the file (read-only otherwise, see below).
        cfg = volume(self.node, "containerd-config")["hostPath"]
        self.assertEqual(cfg, {"path": "/etc/containerd", "type": "Directory"})
        cfg_mount = mount(init, "containerd-config")
        self.assertFalse(cfg_mount["readOnly"])
        mirror_only = render([FULL_VALUES], sets=["containerd.configureSnapshotter=false"])
        init_mirror_only = container(mirror_only.node(), "containerd-config", init=True)
        self.assertTrue(mount(init_mirror_only, "containerd-config")["readOnly"])
        self.assertNotIn("--snapshotter-socket", init_mirror_only["args"])
        self.assertEqual(flag(args, "--containerd-config"), cfg_mount["mountPath"] + "/config.toml")
        self.assertEqual(init["securityContext"]["capabilities"]["drop"], ["ALL"])
        self.assertNotIn("privileged", init["securityContext"])

    def test_snapshotter(self):
        """The agent serves containerd's snapshots API on a socket in the node's socket
        dir; its root is the node's path in the pod with Bidirectional propagation (the
        images' FUSE mounts must reach containerd's overlays); a keeper container holds
        the mounts' connections over agent restarts; the init container points
        containerd's config at the same socket."""
        snap = self.config["snapshotter"]
        socket_dir = mount(self.agent_c, "socket-dir")["mountPath"]
        self.assertEqual(snap["socket"], socket_dir + "/snapshotter.sock")
        self.assertEqual(volume(self.agent, "socket-dir")["hostPath"]["path"], socket_dir)
        root = snap["root"]
        self.assertEqual(volume(self.agent, "snapshotter-root")["hostPath"],
                         {"path": root, "type": "DirectoryOrCreate"})
        m = mount(self.agent_c, "snapshotter-root")
        self.assertEqual((m["mountPath"], m["mountPropagation"]), (root, "Bidirectional"))
        keeper = container(self.node, "fuse-keeper")
        self.assertEqual(keeper["command"], ["/usr/local/bin/tessera"])
        self.assertEqual(keeper["args"][0], "fuse-keeper")
        # The socket the agent looks for: <root>/fuse-keeper.sock.
        self.assertEqual(flag(keeper["args"], "--socket"), root + "/fuse-keeper.sock")
        self.assertIn("--stay", keeper["args"])
        km = mount(keeper, "snapshotter-root")
        self.assertEqual((km["mountPath"], km["mountPropagation"]), (root, "HostToContainer"))
        init = container(self.node, "containerd-config", init=True)
        self.assertEqual(flag(init["args"], "--snapshotter-socket"), snap["socket"])
        # Only the snapshotter: no hosts files, no certs.d volume.
        only = render([FULL_VALUES], sets=["containerd.configureMirror=false"])
        init_only = container(only.node(), "containerd-config", init=True)
        self.assertNotIn("--registry", init_only["args"])
        self.assertNotIn("containerd-certs", [v["name"] for v in only.node()["spec"]["template"]["spec"]["volumes"]])
        self.assertEqual(flag(init_only["args"], "--snapshotter-socket"), snap["socket"])
        notes = render_notes([FULL_VALUES])
        self.assertIn("restart containerd", notes)

    def test_agent_runs_on_the_native_runtime_and_the_node_pod_outlives_it(self):
        """With the snapshotter containerd's default, the agent's pods run (and pull
        their image) on the runtime handler containerd-config writes beside it, named
        by a RuntimeClass; the FUSE keeper and containerd's configuration are in a
        DaemonSet of their own that upgrades never roll, so a rollout of the agents
        hands the mounts over and never rewrites containerd's config."""
        pod = self.agent["spec"]["template"]
        self.assertEqual(pod["spec"]["runtimeClassName"], "tessera-native")
        self.assertEqual(pod["metadata"]["annotations"]["io.containerd.cri.runtime-handler"],
                         "tessera-native")
        rc = self.m.get("RuntimeClass", "tessera-native")
        self.assertEqual(rc["handler"], "tessera-native")
        init = container(self.node, "containerd-config", init=True)
        self.assertEqual(flag(init["args"], "--native-runtime"), "tessera-native")
        # The kubelet's image filesystem is where the snapshotter keeps its snapshots.
        self.assertEqual(flag(init["args"], "--snapshotter-root"), self.config["snapshotter"]["root"])
        self.assertEqual(self.node["spec"]["updateStrategy"], {"type": "OnDelete"})
        self.assertNotIn("runtimeClassName", self.node["spec"]["template"]["spec"])
        self.assertEqual([c["name"] for c in self.agent_pod["containers"]], ["agent"])
        self.assertNotIn("initContainers", self.agent_pod)
        # On the agents' nodes.
        for key in ["nodeSelector", "tolerations", "affinity"]:
            self.assertEqual(self.node["spec"]["template"]["spec"].get(key), self.agent_pod.get(key), key)
        # Another name reaches the handler, the class and the flag alike.
        other = render([FULL_VALUES], ["containerd.nativeRuntime=infra"])
        self.assertEqual(other.agent()["spec"]["template"]["spec"]["runtimeClassName"], "infra")
        self.assertEqual(other.get("RuntimeClass", "infra")["handler"], "infra")
        self.assertEqual(flag(container(other.node(), "containerd-config", init=True)["args"],
                              "--native-runtime"), "infra")
        # containerd configured by hand: the agent on the default runtime, no class.
        mine = render([FULL_VALUES], ["containerd.configureSnapshotter=false"])
        self.assertNotIn("runtimeClassName", mine.agent()["spec"]["template"]["spec"])
        self.assertEqual(mine.of_kind("RuntimeClass"), [])
        # No snapshotter: no node DaemonSet; the mirror's hosts files written by the
        # agent's own init container.
        mirror = render([FULL_VALUES], ["containerd.configureSnapshotter=false",
                                        "agent.snapshotter.enabled=false", "agent.criProxy.enabled=false"])
        self.assertIsNone(mirror.find("DaemonSet", "t-tessera-node"))
        init = container(mirror.agent(), "containerd-config", init=True)
        self.assertIn("--registry", init["args"])
        self.assertNotIn("--native-runtime", init["args"])
        self.assertEqual(volume(mirror.agent(), "containerd-certs")["hostPath"]["path"], "/etc/containerd/certs.d")
        validate_kubernetes(self, mirror)

    def test_cri_proxy(self):
        """The kubelet's image service: a socket beside the agent's on the node, passing
        calls on to containerd's socket, whose directory is mounted at the node's path
        (a restarted containerd's new socket appears in it); the credentials file, when
        asked for, in the snapshotter's root on the node; the notes say what to change
        on the kubelet."""
        cri = self.config["cri"]
        socket_dir = mount(self.agent_c, "socket-dir")["mountPath"]
        self.assertEqual(cri["listen"], socket_dir + "/cri.sock")
        self.assertEqual(cri["containerd"], "/run/containerd/containerd.sock")
        self.assertEqual(volume(self.agent, "containerd-socket-dir")["hostPath"],
                         {"path": "/run/containerd", "type": "Directory"})
        m = mount(self.agent_c, "containerd-socket-dir")
        self.assertEqual((m["mountPath"], m["mountPropagation"]), ("/run/containerd", "HostToContainer"))
        self.assertNotIn("readOnly", m, "connecting to a unix socket needs write access")
        # The file outlives the pod: it is under a hostPath the agent already has.
        root = self.config["snapshotter"]["root"]
        self.assertEqual(cri["credentials_file"], root + "/cri-credentials.json")
        self.assertEqual(mount(self.agent_c, "snapshotter-root")["mountPath"], root)
        self.assertEqual(volume(self.agent, "snapshotter-root")["hostPath"]["path"], root)
        # The keeper does not need containerd.
        self.assertNotIn("containerd-socket-dir",
                         [x["name"] for x in container(self.node, "fuse-keeper")["volumeMounts"]])
        notes = render_notes([FULL_VALUES])
        self.assertIn("--image-service-endpoint=unix:///run/tessera/cri.sock", notes)
        self.assertIn("imageServiceEndpoint: unix:///run/tessera/cri.sock", notes)
        self.assertIn("restart the kubelet", notes)
        self.assertIn("stays containerd's", notes)
        self.assertIn("imagePullSecrets", notes)
        # The kubelet then depends on the agent for its own restart: the notes say so.
        self.assertIn("the agent cannot start again", notes)
        self.assertIn("point its kubelet back at containerd", notes)
        self.assertIn("/var/lib/tessera/snapshotter/cri-credentials.json", notes)

        # Another containerd (k3s), another socket name, credentials in memory only.
        other = render([FULL_VALUES], [
            "agent.criProxy.containerdSocket=/run/k3s/containerd/containerd.sock",
            "agent.criProxy.socketName=image.sock", "agent.socketDir=/run/tessera-x",
            "agent.criProxy.keepCredentialsAcrossRestarts=false"])
        config = tomllib.loads(other.agent_config_text())
        self.assertEqual(config["cri"], {"listen": "/run/tessera-x/image.sock",
                                         "containerd": "/run/k3s/containerd/containerd.sock"})
        self.assertEqual(volume(other.agent(), "containerd-socket-dir")["hostPath"]["path"],
                         "/run/k3s/containerd")
        self.assertEqual(mount(container(other.agent(), "agent"), "containerd-socket-dir")["mountPath"],
                         "/run/k3s/containerd")
        validate_kubernetes(self, other)
        notes = render_notes([FULL_VALUES], [
            "agent.criProxy.socketName=image.sock", "agent.criProxy.keepCredentialsAcrossRestarts=false"])
        self.assertIn("--image-service-endpoint=unix:///run/tessera/image.sock", notes)
        self.assertIn("in the agent's memory only", notes)
        self.assertNotIn("cri-credentials.json", notes)

        # Off: no [cri], no containerd mount, the snapshotter as before.
        off = render([FULL_VALUES], ["agent.criProxy.enabled=false"])
        self.assertNotIn("cri", tomllib.loads(off.agent_config_text()))
        self.assertNotIn("containerd-socket-dir",
                         [v["name"] for v in off.agent()["spec"]["template"]["spec"]["volumes"]])
        self.assertNotIn("image-service-endpoint",
                         render_notes([FULL_VALUES], ["agent.criProxy.enabled=false"]))

    def test_layer_store(self):
        """containers/storage's additional layer store: `--store-root` names a hostPath
        mounted at the node's path with Bidirectional propagation (the FUSE mount must
        reach CRI-O), and the cache too is at the node's path, Bidirectional: the
        store's diff directories are symlinks to the images' trees mounted under it,
        which CRI-O resolves on the node."""
        root = "/var/lib/tessera/store"
        args = self.agent_c["args"]
        self.assertEqual(flag(args, "--store-root"), root)
        self.assertEqual(args.count("--store-root"), 1)
        self.assertEqual(volume(self.agent, "layer-store")["hostPath"],
                         {"path": root, "type": "DirectoryOrCreate"})
        m = mount(self.agent_c, "layer-store")
        self.assertEqual((m["mountPath"], m["mountPropagation"]), (root, "Bidirectional"))
        self.assertTrue(self.agent_c["securityContext"]["privileged"],
                        "FUSE and Bidirectional propagation need it")
        cache = volume(self.agent, "cache")["hostPath"]["path"]
        cm = mount(self.agent_c, "cache")
        self.assertEqual((cm["mountPath"], cm["mountPropagation"]), (cache, "Bidirectional"))
        self.assertEqual(self.config["cache_dir"], cache)
        self.assertEqual(env_value(self.agent_c, "TESSERA_CACHE_DIR"), cache)
        # Neither in the agent's config (the flag is the one place) nor in the keeper.
        self.assertNotIn("store_root", self.config)
        self.assertNotIn("layer-store", [x["name"] for x in container(self.node, "fuse-keeper")["volumeMounts"]])
        notes = render_notes([FULL_VALUES])
        self.assertIn(f'additionallayerstores = ["{root}:ref"]', notes)
        self.assertIn(f"mkdir -p {root}", notes)
        self.assertIn("systemctl restart crio", notes)
        self.assertIn("Podman 5.1 and later", notes)

        # Another root, with the layer store alone: a volume of its own, still privileged.
        other = render(sets=["agent.layerStore.enabled=true", "agent.layerStore.root=/srv/als"])
        c = container(other.agent(), "agent")
        self.assertEqual(flag(c["args"], "--store-root"), "/srv/als")
        self.assertEqual(volume(other.agent(), "layer-store")["hostPath"]["path"], "/srv/als")
        self.assertEqual(mount(c, "layer-store")["mountPath"], "/srv/als")
        self.assertEqual(mount(c, "cache")["mountPropagation"], "Bidirectional")
        self.assertTrue(c["securityContext"]["privileged"])
        validate_kubernetes(self, other)
        # Roots the schema refuses: relative, "/", a trailing slash, "..".
        for bad in ["srv/als", "/", "/srv/als/", "/srv/../als", "/srv//als"]:
            with self.subTest(root=bad):
                proc = helm(*template_args(sets=["agent.layerStore.enabled=true",
                                                 f"agent.layerStore.root={bad}"]), check=False)
                self.assertNotEqual(proc.returncode, 0, bad)
                self.assertIn("/agent/layerStore/root", proc.stderr)
        # Each path the agent mounts, whichever way round.
        for key, value in [("agent.mountRoot", "/var/lib/tessera/store"),
                           ("agent.socketDir", "/var/lib/tessera/store/run"),
                           ("agent.cache.hostPath", "/var/lib"),
                           ("agent.snapshotter.root", "/var/lib/tessera/store/")]:
            with self.subTest(key=key):
                proc = helm(*template_args([FULL_VALUES], [f"{key}={value}"]), check=False)
                self.assertNotEqual(proc.returncode, 0, key)
                self.assertIn(f"agent.layerStore.root (/var/lib/tessera/store) must not be {key} ({value})",
                              proc.stderr)
        # Off, the snapshotter's root may be anywhere.
        render([FULL_VALUES], ["agent.snapshotter.enabled=false", "containerd.configureSnapshotter=false",
                               "agent.criProxy.enabled=false", "agent.snapshotter.root=/var/lib/tessera/store/x"])

    def test_mirror_last_known_answers(self):
        self.assertEqual(self.config["mirror"]["last_known_secs"], 3600)
        self.assertIn("the last 3600 s (agent.mirror.lastKnownSecs)", render_notes([FULL_VALUES]))

    def test_service_monitors(self):
        sms = {s["metadata"]["name"]: s for s in self.m.of_kind("ServiceMonitor")}
        self.assertEqual(set(sms), {"t-tessera-scheduler", "t-tessera-agent"})
        for sm in sms.values():
            self.assertEqual(sm["metadata"]["labels"]["release"], "prometheus")
        ep = sms["t-tessera-scheduler"]["spec"]["endpoints"][0]
        self.assertEqual((ep["port"], ep["path"], ep["scheme"]), ("admin", "/metrics", "https"))
        self.assertEqual(ep["authorization"]["credentials"], {"name": "t-tessera-admin-tokens", "key": "read-token"})
        self.assertEqual(ep["tlsConfig"]["ca"]["secret"], {"name": "tessera-ca", "key": "ca.crt"})
        # Each selects exactly one Service, which has the named port.
        services = self.m.of_kind("Service")
        for sm in sms.values():
            want = sm["spec"]["selector"]["matchLabels"]
            chosen = [s for s in services if want.items() <= s["metadata"]["labels"].items()]
            self.assertEqual(len(chosen), 1, f"{sm['metadata']['name']} selects {[s['metadata']['name'] for s in chosen]}")
            port = sm["spec"]["endpoints"][0]["port"]
            self.assertIn(port, [p["name"] for p in chosen[0]["spec"]["ports"]])
        self.assertEqual(ep["tlsConfig"]["serverName"], "t-tessera-scheduler.tessera-system.svc")

    def test_agent_config_is_toml_with_every_value(self):
        c = self.config
        self.assertEqual(c["prefetch"], "all")
        self.assertEqual(c["fetch"], {"merge_bytes": "2M", "readahead_bytes": "16M", "memory_bytes": "128M",
                                      "attempts": 4, "retries": 5, "timeout_secs": 20, "workers": 32,
                                      "prefetch_concurrency": 4, "slow_read_ms": 500})
        self.assertEqual(c["p2p"]["zone"], "eu-1a")
        self.assertEqual(c["p2p"]["rack"], "r12")
        self.assertEqual(c["p2p"]["max_uploads"], 64)
        self.assertEqual(c["p2p"]["upload_bytes_per_sec"], "200M")
        self.assertEqual(c["p2p"]["compress_uploads"], "always")
        self.assertEqual((c["p2p"]["peer_timeout_ms"], c["p2p"]["max_wait_secs"]), (2000, 15))
        self.assertEqual((c["mirror"]["max_wait_secs"], c["mirror"]["access_ttl_secs"],
                          c["mirror"]["manifest_ttl_secs"], c["mirror"]["last_known_secs"]),
                         (200, 30, 120, 3600))
        # Sizes given as numbers stay integers, however large.
        n = tomllib.loads(render(sets=["agent.cache.capacity=107374182400"]).agent_config_text())
        self.assertEqual(n["cache_capacity"], 107374182400)

    def test_scheduler_flags_exist(self):
        """Every flag the chart passes is one `tessera-scheduler --help` lists."""
        help_text = subprocess.run([str(SCHEDULER), "--help"], capture_output=True, text=True, check=True).stdout
        known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
        passed = [a for a in self.sched_c["args"] if a.startswith("--")]
        self.assertGreaterEqual(len(passed), 10)
        for a in passed:
            self.assertIn(a, known, f"tessera-scheduler has no {a}")
        self.assertEqual(len(passed), len(set(passed)), "a flag given twice is refused")

    def test_agent_flags_exist(self):
        for sub, args in [("agent", container(self.agent, "agent")["args"][1:]),
                          ("containerd-config", container(self.node, "containerd-config", init=True)["args"][1:]),
                          ("fuse-keeper", container(self.node, "fuse-keeper")["args"][1:]),
                          ("status", self.agent_c["readinessProbe"]["exec"]["command"][2:])]:
            help_text = subprocess.run([str(TESSERA), sub, "--help"], capture_output=True, text=True,
                                       check=True).stdout
            known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
            for a in args:
                if a.startswith("--"):
                    self.assertIn(a, known, f"tessera {sub} has no {a}")

    def test_config_changes_roll_the_agents(self):
        def annotations(*sets, values=()):
            return render([FULL_VALUES, *values], sets).agent()["spec"]["template"]["metadata"]["annotations"]
        base = annotations()
        self.assertRegex(base["checksum/config"], "^[0-9a-f]{64}$")
        self.assertNotEqual(annotations("agent.cache.capacity=20G")["checksum/config"], base["checksum/config"])
        self.assertNotEqual(annotations("scheduler.replicas=4")["checksum/config"], base["checksum/config"])
        self.assertEqual(annotations("scheduler.logLevel=warn")["checksum/config"], base["checksum/config"])
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as other:
            other.write("registryCredentials:\n  dockerConfigJson: '{\"auths\": {}}'\n")
            other.flush()
            self.assertNotEqual(annotations(values=[other.name])["checksum/registry-credentials"],
                                base["checksum/registry-credentials"])
        self.assertEqual(base["example.com/scrape"], "true")
        self.assertNotIn("checksum/config", annotations("agent.rollOnConfigChange=false"))


class BadValues(unittest.TestCase):
    """Values that must not install: helm fails naming the key."""

    def test_each_bad_values_file_fails_naming_the_key(self):
        files = sorted((TESTS / "bad-values").glob("*.yaml"))
        self.assertGreaterEqual(len(files), 8)
        for f in files:
            expect = re.search(r"^# expect: (.+)$", f.read_text(), re.M)
            self.assertIsNotNone(expect, f"{f.name}: no '# expect:' line")
            with self.subTest(values=f.name):
                proc = helm(*template_args([f]), check=False)
                self.assertNotEqual(proc.returncode, 0, f"{f.name} rendered:\n{proc.stdout[:2000]}")
                self.assertIn(expect.group(1), proc.stderr)
                # Good values plus this file's mistake fail the same way.
                proc = helm(*template_args([FULL_VALUES, f]), check=False)
                self.assertNotEqual(proc.returncode, 0)
                self.assertIn(expect.group(1), proc.stderr)


class ValuesFile(unittest.TestCase):
    """values.yaml documents every key, and the schema knows every key."""

    def test_every_key_has_a_comment_above_it(self):
        lines = (CHART / "values.yaml").read_text().splitlines()
        undocumented = []
        parents = []  # (indent, key)
        for n, line in enumerate(lines):
            m = re.match(r"^( *)([A-Za-z0-9_.]+):", line)
            if not m:
                continue
            indent, key = len(m.group(1)), m.group(2)
            while parents and parents[-1][0] >= indent:
                parents.pop()
            free = any(p in FREE_FORM for _, p in parents)
            parents.append((indent, key))
            if free:
                continue
            above = next((lines[i] for i in range(n - 1, -1, -1) if lines[i].strip()), "")
            if not above.strip().startswith("#"):
                undocumented.append(f"line {n + 1}: {key}")
        self.assertEqual(undocumented, [])

    def test_the_schema_is_draft_07_and_closed(self):
        schema = yaml.safe_load((CHART / "values.schema.json").read_text())
        self.assertEqual(schema["$schema"], "http://json-schema.org/draft-07/schema#")
        jsonschema.Draft7Validator.check_schema(schema)
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        jsonschema.Draft7Validator(schema).validate(values)
        full = yaml.safe_load(FULL_VALUES.read_text())
        jsonschema.Draft7Validator(schema).validate(full)

        # Every object of the chart's own is closed, and every values.yaml key is in it.
        def walk(node, value, path):
            if node.get("type") != "object" or "properties" not in node:
                return
            self.assertIs(node.get("additionalProperties"), False, path)
            for k, v in value.items():
                self.assertIn(k, node["properties"], f"{path}.{k} is not in the schema")
                if isinstance(v, dict):
                    walk(node["properties"][k], v, f"{path}.{k}")
        walk(schema, values, "values")


if __name__ == "__main__":
    unittest.main()
