{{/*
Names, labels and the values several templates share: where each Secret and file
is, the scheduler replicas' addresses, and the agent's config.
*/}}

{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>", or the release name alone when it already contains the chart's. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tessera.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ include "tessera.chart" . }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tessera
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Per component: the labels and the selector, e.g. (dict "ctx" $ "component" "agent"). */}}
{{- define "tessera.componentLabels" -}}
{{ include "tessera.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tessera.componentSelectorLabels" -}}
{{ include "tessera.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tessera.agent.fullname" -}}
{{- printf "%s-agent" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The node DaemonSet: what must outlive an agent's pod on each node. */}}
{{- define "tessera.node.fullname" -}}
{{- printf "%s-node" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where containerd's configuration is written from: the node DaemonSet when there
is one (the snapshotter's), so an agent's rollout never edits it; else the agent's. */}}
{{- define "tessera.containerdConfigured" -}}
{{- if or .Values.containerd.configureMirror .Values.containerd.configureSnapshotter }}
{{- if .Values.agent.snapshotter.enabled }}node{{ else }}agent{{ end }}
{{- end }}
{{- end }}

{{/* The init container running `tessera containerd-config`, and its volumes. */}}
{{- define "tessera.containerdConfigContainer" -}}
# Points containerd's hosts files at the mirror and/or its config at the
# snapshotter (with the runtime handler the agent's pod runs on): idempotent,
# backs up files it did not write, never restarts containerd.
- name: containerd-config
  image: {{ include "tessera.agent.image" . }}
  imagePullPolicy: {{ .Values.agent.image.pullPolicy }}
  command:
    - /usr/local/bin/tessera
  args:
    - containerd-config
    {{- if .Values.containerd.configureMirror }}
    {{- range .Values.containerd.registries }}
    - --registry
    - {{ . | quote }}
    {{- end }}
    {{- if .Values.containerd.all }}
    - --all
    {{- end }}
    {{- range .Values.containerd.insecure }}
    - --insecure
    - {{ . | quote }}
    {{- end }}
    - --mirror
    - {{ printf "http://127.0.0.1:%d" (int .Values.agent.mirror.port) | quote }}
    - --certs-dir
    - {{ .Values.containerd.certsDir | quote }}
    {{- end }}
    {{- if .Values.containerd.configureSnapshotter }}
    - --snapshotter-socket
    - {{ printf "%s/%s" .Values.agent.socketDir .Values.agent.snapshotter.socketName | quote }}
    - --native-runtime
    - {{ .Values.containerd.nativeRuntime | quote }}
    # Exported to containerd: the image filesystem the kubelet's image GC measures.
    - --snapshotter-root
    - {{ .Values.agent.snapshotter.root | quote }}
    {{- end }}
    - --containerd-config
    - {{ printf "/host/containerd-config/%s" (base .Values.containerd.configFile) | quote }}
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop:
        - ALL
  volumeMounts:
    {{- if .Values.containerd.configureMirror }}
    # The same path as on the node: the command checks that containerd's
    # config_path names it.
    - name: containerd-certs
      mountPath: {{ .Values.containerd.certsDir }}
    {{- end }}
    - name: containerd-config
      mountPath: /host/containerd-config
      # Written only to make the snapshotter containerd's.
      readOnly: {{ not .Values.containerd.configureSnapshotter }}
{{- end }}

{{- define "tessera.containerdConfigVolumes" -}}
{{- if .Values.containerd.configureMirror }}
- name: containerd-certs
  hostPath:
    path: {{ .Values.containerd.certsDir }}
    type: DirectoryOrCreate
{{- end }}
- name: containerd-config
  hostPath:
    path: {{ dir .Values.containerd.configFile }}
    type: Directory
{{- end }}

{{- define "tessera.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "tessera.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service giving each replica its DNS name. */}}
{{- define "tessera.scheduler.headless" -}}
{{- printf "%s-headless" (include "tessera.scheduler.fullname" .) }}
{{- end }}

{{- define "tessera.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "tessera.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tessera.scheduler.serviceAccountName" -}}
{{- if .Values.scheduler.serviceAccount.create }}
{{- default (include "tessera.scheduler.fullname" .) .Values.scheduler.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.scheduler.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Images: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "tessera.agent.image" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) }}
{{- end }}

{{- define "tessera.scheduler.image" -}}
{{- printf "%s:%s" .Values.scheduler.image.repository (default .Chart.AppVersion .Values.scheduler.image.tag) }}
{{- end }}

{{/* Secrets: the chart's own unless an existing one is named. */}}
{{- define "tessera.p2pSecretName" -}}
{{- default (printf "%s-p2p-token" (include "tessera.fullname" .)) .Values.auth.p2p.existingSecret }}
{{- end }}

{{- define "tessera.p2pSecretKey" -}}
{{- if .Values.auth.p2p.existingSecret }}{{ .Values.auth.p2p.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "tessera.adminSecretName" -}}
{{- default (printf "%s-admin-tokens" (include "tessera.fullname" .)) .Values.auth.admin.existingSecret }}
{{- end }}

{{- define "tessera.adminSecretAdminKey" -}}
{{- if .Values.auth.admin.existingSecret }}{{ .Values.auth.admin.existingSecretAdminKey }}{{ else }}admin-token{{ end }}
{{- end }}

{{- define "tessera.adminSecretReadKey" -}}
{{- if .Values.auth.admin.existingSecret }}{{ .Values.auth.admin.existingSecretReadKey }}{{ else }}read-token{{ end }}
{{- end }}

{{- define "tessera.registrySecretName" -}}
{{- default (printf "%s-registry" (include "tessera.fullname" .)) .Values.registryCredentials.existingSecret }}
{{- end }}

{{- define "tessera.registrySecretKey" -}}
{{- if .Values.registryCredentials.existingSecret }}{{ .Values.registryCredentials.existingSecretKey }}{{ else }}.dockerconfigjson{{ end }}
{{- end }}

{{/*
A token for a generated Secret: the value given, else the one already in the Secret
(so upgrades keep it), else a new random one.
(dict "ctx" $ "secret" NAME "key" KEY "value" GIVEN)
*/}}
{{- define "tessera.token" -}}
{{- if .value }}
{{- .value }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .secret }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- index $existing.data .key | b64dec }}
{{- else }}
{{- randAlphaNum 48 }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where the pods find what they mount. */}}
{{- define "tessera.paths" -}}
config: /etc/tessera/config
p2pToken: /etc/tessera/p2p
adminTokens: /etc/tessera/admin
registry: /etc/tessera/registry
schedulerTls: /etc/tessera/tls/scheduler
ca: /etc/tessera/tls/ca
peerTls: /etc/tessera/tls/peer
cache: /var/lib/tessera/cache
state: /var/lib/tessera-scheduler
{{- end }}

{{/* The scheduler URLs agents use, comma separated: every replica by its pod DNS name. */}}
{{- define "tessera.schedulerURLs" -}}
{{- if .Values.agent.p2p.schedulerURLs }}
{{- join "," .Values.agent.p2p.schedulerURLs }}
{{- else if .Values.scheduler.enabled }}
{{- $scheme := ternary "https" "http" .Values.tls.enabled }}
{{- $sts := include "tessera.scheduler.fullname" . }}
{{- $domain := printf "%s.%s.svc" (include "tessera.scheduler.headless" .) .Release.Namespace }}
{{- if .Values.clusterDomain }}
{{- $domain = printf "%s.%s" $domain .Values.clusterDomain }}
{{- end }}
{{- $urls := list }}
{{- range $i := until (int .Values.scheduler.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s:%d" $scheme $sts $i $domain (int $.Values.scheduler.grpcPort)) }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- end }}

{{/* A TOML value: sizes may be given as "10G" or as a number of bytes. */}}
{{- define "tessera.tomlSize" -}}
{{- if kindIs "string" . }}{{ toJson . }}{{ else }}{{ int64 . }}{{ end }}
{{- end }}

{{/* The agent's config file, agent.toml (keys of agent/src/config.rs). */}}
{{- define "tessera.agent.config" -}}
{{- $a := .Values.agent }}
{{- $paths := include "tessera.paths" . | fromYaml }}
{{- $urls := include "tessera.schedulerURLs" . -}}
# agent.toml, rendered by the Helm chart {{ include "tessera.chart" . }} from its values
# (agent.*). The DaemonSet adds by environment: TESSERA_ADVERTISE (the node IP and the
# peer port), TESSERA_HOST_ID (the node name) and TESSERA_METRICS_LISTEN (the node IP).
socket = {{ printf "%s/agent.sock" $a.socketDir | toJson }}
cache_dir = {{ include "tessera.agent.cacheDir" . | toJson }}
cache_capacity = {{ include "tessera.tomlSize" $a.cache.capacity }}
cache_disk_high_percent = {{ int64 $a.cache.diskHighPercent }}
cache_disk_low_percent = {{ int64 $a.cache.diskLowPercent }}
prefetch = {{ $a.prefetch | toJson }}
shutdown_grace_secs = {{ int64 $a.shutdownGraceSeconds }}
passthrough = {{ $a.cache.passthrough }}

[scrub]
bytes_per_sec = {{ include "tessera.tomlSize" $a.cache.scrubBytesPerSec }}
every_hours = {{ int64 $a.cache.scrubEveryHours }}

[fetch]
merge_bytes = {{ include "tessera.tomlSize" $a.fetch.mergeBytes }}
readahead_bytes = {{ include "tessera.tomlSize" $a.fetch.readaheadBytes }}
memory_bytes = {{ include "tessera.tomlSize" $a.fetch.memoryBytes }}
attempts = {{ int64 $a.fetch.attempts }}
retries = {{ int64 $a.fetch.retries }}
timeout_secs = {{ int64 $a.fetch.timeoutSecs }}
workers = {{ int64 $a.fetch.workers }}
prefetch_concurrency = {{ int64 $a.fetch.prefetchConcurrency }}
slow_read_ms = {{ int64 $a.fetch.slowReadMs }}

[p2p]
enabled = {{ and $a.p2p.enabled (ne $urls "") }}
{{- if $urls }}
scheduler = {{ $urls | toJson }}
{{- end }}
peer_listen = {{ printf "%s:%d" (ternary "[::]" "0.0.0.0" (eq $a.p2p.ipFamily "IPv6")) (int $a.p2p.port) | toJson }}
token_file = {{ printf "%s/token" $paths.p2pToken | toJson }}
{{- with $a.p2p.zone }}
zone = {{ . | toJson }}
{{- end }}
{{- with $a.p2p.rack }}
rack = {{ . | toJson }}
{{- end }}
max_uploads = {{ int64 $a.p2p.maxUploads }}
upload_bytes_per_sec = {{ include "tessera.tomlSize" $a.p2p.uploadBytesPerSec }}
compress_uploads = {{ $a.p2p.compressUploads | toJson }}
peer_timeout_ms = {{ int64 $a.p2p.peerTimeoutMs }}
max_wait_secs = {{ int64 $a.p2p.maxWaitSecs }}
{{- if or .Values.tls.enabled .Values.tls.peers.enabled }}
tls_ca = {{ printf "%s/ca.crt" $paths.ca | toJson }}
{{- end }}
{{- if .Values.tls.peers.enabled }}
tls_cert = {{ printf "%s/tls.crt" $paths.peerTls | toJson }}
tls_key = {{ printf "%s/tls.key" $paths.peerTls | toJson }}
{{- with .Values.tls.peers.serverName }}
tls_server_name = {{ . | toJson }}
{{- end }}
{{- end }}

[mirror]
{{- if $a.mirror.enabled }}
listen = {{ printf "127.0.0.1:%d" (int $a.mirror.port) | toJson }}
{{- end }}
default_registry = {{ $a.mirror.defaultRegistry | toJson }}
max_wait_secs = {{ int64 $a.mirror.maxWaitSecs }}
access_ttl_secs = {{ int64 $a.mirror.accessTtlSecs }}
manifest_ttl_secs = {{ int64 $a.mirror.manifestTtlSecs }}
last_known_secs = {{ int64 $a.mirror.lastKnownSecs }}

{{- if $a.snapshotter.enabled }}

[snapshotter]
socket = {{ printf "%s/%s" $a.socketDir $a.snapshotter.socketName | toJson }}
root = {{ $a.snapshotter.root | toJson }}
{{- end }}

{{- if $a.criProxy.enabled }}

[cri]
listen = {{ printf "%s/%s" $a.socketDir $a.criProxy.socketName | toJson }}
containerd = {{ $a.criProxy.containerdSocket | toJson }}
{{- if $a.criProxy.keepCredentialsAcrossRestarts }}
credentials_file = {{ include "tessera.agent.criCredentialsFile" . | toJson }}
{{- end }}
{{- end }}

[registry]
insecure = {{ $a.insecureRegistries | toJson }}
{{- if .Values.registryCredentials.enabled }}
auth_file = {{ printf "%s/config.json" $paths.registry | toJson }}
{{- end }}
{{- end }}

{{/* The chunk cache's path in the agent's pod. With the layer store, the node's own:
the store's diff directories are symlinks to the images' trees, which the agent mounts
under <cache>/layer-store, and CRI-O resolves those links on the node. */}}
{{- define "tessera.agent.cacheDir" -}}
{{- if .Values.agent.layerStore.enabled }}
{{- trimSuffix "/" .Values.agent.cache.hostPath }}
{{- else }}
{{- (include "tessera.paths" . | fromYaml).cache }}
{{- end }}
{{- end }}

{{/* The CRI proxy's credentials file (keepCredentialsAcrossRestarts): in the
snapshotter's root, a hostPath the agent already mounts, so it outlives the pod. */}}
{{- define "tessera.agent.criCredentialsFile" -}}
{{- printf "%s/cri-credentials.json" (trimSuffix "/" .Values.agent.snapshotter.root) }}
{{- end }}

{{/* The node IP with a port, as an ip:port the agent accepts (brackets for IPv6). */}}
{{- define "tessera.agent.hostAddr" -}}
{{- if eq .ctx.Values.agent.p2p.ipFamily "IPv6" }}[$(HOST_IP)]:{{ .port }}{{ else }}$(HOST_IP):{{ .port }}{{ end }}
{{- end }}
