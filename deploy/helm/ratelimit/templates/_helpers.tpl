{{/* The release's name, with the chart's unless it holds it already. */}}
{{- define "ratelimit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of the service's pods: name and instance, never changed by an upgrade. */}}
{{- define "ratelimit.selectorLabels" -}}
app.kubernetes.io/name: ratelimit
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object; pass (dict "ctx" $ "name" NAME "component" COMPONENT). */}}
{{- define "ratelimit.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: ratelimit
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- end -}}

{{/* The bundled Redis's Service name. */}}
{{- define "ratelimit.redisName" -}}
{{- printf "%s-redis" (include "ratelimit.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The Redis addresses, host:port each: the bundled Redis's, or redis.addresses.
Fails on values that cannot work rather than render a pod that would count
alone (no Redis: the embedded store, one per replica). values.schema.json
refuses unknown values and modes.
*/}}
{{- define "ratelimit.redisAddresses" -}}
{{- $r := .Values.redis -}}
{{- if $r.bundled.enabled -}}
{{- if ne $r.mode "standalone" -}}
{{- fail "redis.bundled runs a standalone Redis: for sentinel or cluster set redis.bundled.enabled=false and redis.addresses" -}}
{{- end -}}
{{- printf "%s:6379" (include "ratelimit.redisName" .) -}}
{{- else if or .Values.referenceEnvironment (not $r.existingSecret.name) -}}
{{- /* With the flags and a Secret, the Secret holds the whole URL. */ -}}
{{- if not $r.addresses -}}
{{- fail "redis.addresses is empty: name your Redis (or enable redis.bundled)" -}}
{{- end -}}
{{- if and (eq $r.mode "standalone") (gt (len $r.addresses) 1) -}}
{{- fail "redis.mode standalone takes one address" -}}
{{- end -}}
{{- if and (eq $r.mode "sentinel") (not $r.masterName) -}}
{{- fail "redis.mode sentinel needs redis.masterName" -}}
{{- end -}}
{{- join "," $r.addresses -}}
{{- end -}}
{{- end -}}

{{/* A Secret's key as an env entry's valueFrom; not optional: a pod without its Redis must not start. */}}
{{- define "ratelimit.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end -}}

{{/* The Redis settings as the service's RATELIMIT_REDIS_*URL variable (one of three, by mode). */}}
{{- define "ratelimit.redisFlagsEnv" -}}
{{- $r := .Values.redis -}}
{{- $env := get (dict "standalone" "RATELIMIT_REDIS_URL" "sentinel" "RATELIMIT_REDIS_SENTINEL_URL" "cluster" "RATELIMIT_REDIS_CLUSTER_URL") $r.mode -}}
{{- $addrs := splitList "," (include "ratelimit.redisAddresses" .) -}}
{{- if $r.existingSecret.name -}}
{{ include "ratelimit.secretEnv" (dict "env" $env "name" $r.existingSecret.name "key" $r.existingSecret.urlKey) }}
{{- else -}}
{{- $scheme := ternary "rediss" "redis" (and $r.tls (not $r.bundled.enabled)) -}}
{{- $query := list -}}
{{- if eq $r.mode "sentinel" -}}
{{- $query = append $query (printf "master_name=%s" (urlquery $r.masterName)) -}}
{{- end -}}
{{- range rest $addrs -}}
{{- $query = append $query (printf "addr=%s" .) -}}
{{- end -}}
- name: {{ $env }}
  value: {{ printf "%s://%s%s%s" $scheme (first $addrs) (ternary "/0" "" (eq $r.mode "standalone")) (ternary (printf "?%s" (join "&" $query)) "" (gt (len $query) 0)) | quote }}
{{- end -}}
{{- end -}}

{{/* The ledger of the global rules as the service's RATELIMIT_LEDGER_REDIS_*URL variable (one of three, by mode), from its Secret. */}}
{{- define "ratelimit.ledgerEnv" -}}
{{- $g := .Values.regions -}}
{{- if $g.region -}}
{{- if not $g.ledger.existingSecret.name -}}
{{- fail "regions.region needs regions.ledger.existingSecret.name: the Secret holding the ledger's URL" -}}
{{- end -}}
{{- if lt (int $g.count) 1 -}}
{{- fail "regions.region needs regions.count: how many regions share the global rules" -}}
{{- end -}}
{{- $env := get (dict "standalone" "RATELIMIT_LEDGER_REDIS_URL" "sentinel" "RATELIMIT_LEDGER_REDIS_SENTINEL_URL" "cluster" "RATELIMIT_LEDGER_REDIS_CLUSTER_URL") $g.ledger.mode -}}
{{ include "ratelimit.secretEnv" (dict "env" $env "name" $g.ledger.existingSecret.name "key" $g.ledger.existingSecret.urlKey) }}
{{- end -}}
{{- end -}}

{{/* The Redis settings as the reference's REDIS_* variables. */}}
{{- define "ratelimit.redisReferenceEnv" -}}
{{- $r := .Values.redis -}}
{{- $addrs := include "ratelimit.redisAddresses" . -}}
- name: REDIS_SOCKET_TYPE
  value: tcp
- name: REDIS_TYPE
  value: {{ get (dict "standalone" "SINGLE" "sentinel" "SENTINEL" "cluster" "CLUSTER") $r.mode }}
- name: REDIS_URL
  value: {{ ternary (printf "%s,%s" $r.masterName $addrs) $addrs (eq $r.mode "sentinel") | quote }}
{{- if and $r.tls (not $r.bundled.enabled) }}
- name: REDIS_TLS
  value: "true"
{{- end }}
{{- if and $r.existingSecret.name $r.existingSecret.authKey }}
{{ include "ratelimit.secretEnv" (dict "env" "REDIS_AUTH" "name" $r.existingSecret.name "key" $r.existingSecret.authKey) }}
{{- end }}
{{- if and $r.existingSecret.name $r.existingSecret.sentinelAuthKey }}
{{ include "ratelimit.secretEnv" (dict "env" "REDIS_SENTINEL_AUTH" "name" $r.existingSecret.name "key" $r.existingSecret.sentinelAuthKey) }}
{{- end }}
{{- end -}}

{{/* Where the rules ConfigMap is mounted: the reference's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config with its environment. */}}
{{- define "ratelimit.configDir" -}}
{{- ternary "/data/ratelimit/config" "/etc/ratelimit/config" .Values.referenceEnvironment -}}
{{- end -}}

{{/*
The service's container, for both layouts: pass (dict "ctx" $ "sidecar" BOOL).
The sidecar is a native sidecar (an init container with restartPolicy
Always): it passes its startup probe before Envoy and the app start, and
stops after them. Its HTTP port is rl-health, as Envoy's is http.
*/}}
{{- define "ratelimit.container" -}}
{{- $ := .ctx -}}
{{- $v := $.Values -}}
{{- $xds := eq $v.config.source "xds" -}}
{{- if and $xds (not $v.config.xds.serverURL) -}}
{{- fail "config.source xds needs config.xds.serverURL" -}}
{{- end -}}
{{- $layout := ternary $v.sidecar $v.central .sidecar -}}
- name: ratelimit
  image: {{ printf "%s:%s" $v.image.repository ($v.image.tag | default $.Chart.AppVersion) | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .sidecar }}
  restartPolicy: Always
  {{- end }}
  args:
    {{- if not $v.referenceEnvironment }}
    {{- if $xds }}
    - --config-type=GRPC_XDS_SOTW
    - --xds-server-url={{ $v.config.xds.serverURL }}
    - --xds-node-id={{ $v.config.xds.nodeID }}
    {{- if $v.config.xds.forceStartWithoutInitialConfig }}
    - --force-start-without-initial-config
    {{- end }}
    {{- else }}
    - --config={{ include "ratelimit.configDir" $ }}
    {{- end }}
    - --grpc-addr=:8081
    - --http-addr=:8080
    {{- end }}
    - --drain-timeout={{ $v.drainTimeout }}
    {{- if .sidecar }}
    - --max-inflight={{ $v.sidecar.maxInflight }}
    {{- end }}
    {{- if not $v.referenceEnvironment }}
    - --log-format=json
    {{- end }}
    {{- with $v.regions.region }}
    - --region={{ . }}
    - --regions={{ $v.regions.count }}
    {{- end }}
    {{- with $v.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  env:
    {{- if $v.referenceEnvironment }}
    {{- if $xds }}
    - name: CONFIG_TYPE
      value: GRPC_XDS_SOTW
    - name: CONFIG_GRPC_XDS_SERVER_URL
      value: {{ $v.config.xds.serverURL | quote }}
    - name: CONFIG_GRPC_XDS_NODE_ID
      value: {{ $v.config.xds.nodeID | quote }}
    {{- if $v.config.xds.forceStartWithoutInitialConfig }}
    - name: FORCE_START_WITHOUT_INITIAL_CONFIG
      value: "true"
    {{- end }}
    {{- else }}
    # The directory the reference reads, dot entries (the ConfigMap's ..data)
    # skipped, as Envoy Gateway runs it.
    - name: RUNTIME_ROOT
      value: /data
    - name: RUNTIME_SUBDIRECTORY
      value: ratelimit
    - name: RUNTIME_IGNOREDOTFILES
      value: "true"
    {{- end }}
    - name: GRPC_PORT
      value: "8081"
    - name: PORT
      value: "8080"
    # The reference sends statsd to localhost:8125 unless told otherwise; the
    # Prometheus metrics are on the HTTP port either way.
    - name: USE_STATSD
      value: "false"
    - name: LOG_FORMAT
      value: json
    {{- include "ratelimit.redisReferenceEnv" $ | nindent 4 }}
    {{- else }}
    {{- include "ratelimit.redisFlagsEnv" $ | nindent 4 }}
    {{- end }}
    {{- with include "ratelimit.ledgerEnv" $ }}
    {{- . | nindent 4 }}
    {{- end }}
    # The GC runs at a 400% target; a soft limit below the container's makes
    # it collect harder near the limit rather than be killed there.
    - name: GOMEMLIMIT
      value: {{ $layout.goMemLimit | quote }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: grpc
      containerPort: 8081
      protocol: TCP
    - name: {{ ternary "rl-health" "http" .sidecar }}
      containerPort: 8080
      protocol: TCP
    {{- if $v.referenceEnvironment }}
    # The reference's debug port, which opens with its environment: /rlconfig
    # as text (egctl reads it).
    - name: debug
      containerPort: 6070
      protocol: TCP
    {{- end }}
  {{- if .sidecar }}
  startupProbe:
    grpc:
      port: 8081
      service: envoy.service.ratelimit.v3.RateLimitService
    {{- toYaml $v.probes.startup | nindent 4 }}
  {{- end }}
  readinessProbe:
    grpc:
      port: 8081
      service: envoy.service.ratelimit.v3.RateLimitService
    {{- toYaml $v.probes.readiness | nindent 4 }}
  livenessProbe:
    grpc:
      port: 8081
    {{- toYaml $v.probes.liveness | nindent 4 }}
  {{- if not .sidecar }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $v.preStopSleepSeconds }}
  {{- end }}
  resources:
    {{- toYaml $layout.resources | nindent 4 }}
  securityContext:
    runAsUser: 65532 # distroless "nonroot"
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
  {{- if not $xds }}
  volumeMounts:
    # A whole-directory mount (no subPath): the kubelet updates it in place
    # through the ..data symlink when the ConfigMap changes.
    - name: ratelimit-config
      mountPath: {{ include "ratelimit.configDir" $ }}
      readOnly: true
  {{- end }}
{{- end -}}

{{/* The pod settings both layouts share. */}}
{{- define "ratelimit.podSpec" -}}
automountServiceAccountToken: false
# Service links would put RATELIMIT_* variables (from a Service named
# ratelimit) into the environment, which the service reads as flags.
enableServiceLinks: false
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
securityContext:
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The rules volume, unless the config comes over xDS. */}}
{{- define "ratelimit.configVolume" -}}
{{- if ne .Values.config.source "xds" -}}
- name: ratelimit-config
  configMap:
    name: {{ include "ratelimit.fullname" . }}-config
{{- end -}}
{{- end -}}
