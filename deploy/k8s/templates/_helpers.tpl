{{/*
Names, labels and the pieces every role's pod shares: security contexts, gRPC health probes,
the downward-API variables that per-pod addresses are built from, stable DNS names.
*/}}

{{- define "kbroker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kbroker.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A role's resource name: <fullname>-<role>. Call with (list $ "role"). */}}
{{- define "kbroker.roleName" -}}
{{- printf "%s-%s" (include "kbroker.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{- define "kbroker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kbroker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kbroker.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of a role's resources. Call with (list $ "role"). */}}
{{- define "kbroker.labels" -}}
{{- $ := index . 0 -}}
helm.sh/chart: {{ include "kbroker.chart" $ }}
{{ include "kbroker.selectorLabels" . }}
app.kubernetes.io/part-of: kbroker
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
{{- with $.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kbroker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kbroker.serviceAccountName" -}}
{{- default (include "kbroker.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kbroker.replicatorServiceAccountName" -}}
{{- printf "%s-replicator" (include "kbroker.serviceAccountName" .) -}}
{{- end -}}

{{/* host:port a role's gRPC server binds. Call with (list $ port). */}}
{{- define "kbroker.bindAddress" -}}
{{- printf "%s:%v" (index . 0).Values.listenAddress (index . 1) -}}
{{- end -}}

{{/* Cluster DNS suffix of the namespace, resolved in the pod (plain manifests stay
namespace-agnostic): $(POD_NAMESPACE).svc.<clusterDomain>. */}}
{{- define "kbroker.dnsSuffix" -}}
{{- printf "$(POD_NAMESPACE).svc.%s" .Values.clusterDomain -}}
{{- end -}}

{{/* DNS name of a Service of this release. Call with (list $ "service-name"). */}}
{{- define "kbroker.serviceHost" -}}
{{- printf "%s.%s" (index . 1) (include "kbroker.dnsSuffix" (index . 0)) -}}
{{- end -}}

{{/* "0=<log-0 dns>:port,1=..." for the replicator, from the log nodes' headless Service. */}}
{{- define "kbroker.logNodes" -}}
{{- $ := . -}}
{{- $log := include "kbroker.roleName" (list $ "log") -}}
{{- $entries := list -}}
{{- range $i := until (int $.Values.log.replicas) -}}
{{- $entries = append $entries (printf "%d=%s-%d.%s-headless.%s:%v" $i $log $i $log (include "kbroker.dnsSuffix" $) $.Values.log.grpcPort) -}}
{{- end -}}
{{- join "," $entries -}}
{{- end -}}

{{/* Downward-API variables referenced as $(POD_NAME), $(POD_NAMESPACE), $(HOST_IP) in
arguments. Call with a list of the names wanted. */}}
{{- define "kbroker.podEnv" -}}
{{- $fields := dict "POD_NAME" "metadata.name" "POD_NAMESPACE" "metadata.namespace" "HOST_IP" "status.hostIP" -}}
{{- range $name := . }}
- name: {{ $name }}
  valueFrom:
    fieldRef:
      fieldPath: {{ index $fields $name }}
{{- end -}}
{{- end -}}

{{/* Health probes of a gRPC port (grpc.health.v1; see kbroker.probeHandler for how TLS is
handled). Call with (list $ port), or (list $ port readiness liveness) to probe those health
service names (readiness: ready to serve; liveness, also the startup probe: the process is up),
where they differ from the server's overall health (""). */}}
{{- define "kbroker.probes" -}}
{{- $ := index . 0 -}}
{{- $port := index . 1 -}}
{{- $ready := "" -}}
{{- $alive := "" -}}
{{- if gt (len .) 2 -}}
{{- $ready = index . 2 -}}
{{- $alive = index . 3 -}}
{{- end -}}
{{- $p := $.Values.probes -}}
startupProbe:
  {{- include "kbroker.probeHandler" (list $ $port $alive $p.startup.timeoutSeconds) | nindent 2 }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
readinessProbe:
  {{- include "kbroker.probeHandler" (list $ $port $ready $p.readiness.timeoutSeconds) | nindent 2 }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
livenessProbe:
  {{- include "kbroker.probeHandler" (list $ $port $alive $p.liveness.timeoutSeconds) | nindent 2 }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end -}}

{{/* The container fields every service container shares. Call with (list $ roleValues). */}}
{{- define "kbroker.containerCommon" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
image: {{ include "kbroker.image" $ }}
imagePullPolicy: {{ $.Values.image.pullPolicy }}
securityContext:
  {{- toYaml $.Values.containerSecurityContext | nindent 2 }}
resources:
  {{- toYaml $role.resources | nindent 2 }}
{{- end -}}

{{/* Pod spec fields every role shares. Call with (list $ roleValues "role"). */}}
{{- define "kbroker.podCommon" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $role.terminationGracePeriodSeconds }}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $role.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $role.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Preferred spreading of a role's pods over nodes. Call with (list $ "role"). */}}
{{- define "kbroker.softSpread" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "kbroker.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* The role's ConfigMap: KBROKER_<FIELD> for each `<role>.config` entry plus the log level.
Call with (list $ "role"). */}}
{{- define "kbroker.configMap" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "kbroker.roleName" (list $ $role) }}
  labels:
    {{- include "kbroker.labels" (list $ $role) | nindent 4 }}
data:
  KBROKER_LOG_LEVEL: {{ $.Values.logLevel | quote }}
  KBROKER_CPU_SCHEDULING: {{ $.Values.cpuScheduling | quote }}
  {{- range $key, $value := (index $.Values $role).config }}
  KBROKER_{{ upper $key }}: {{ include "kbroker.configValue" $value | quote }}
  {{- end }}
  {{- range $key, $value := include "kbroker.securityEnv" . | fromYaml }}
  {{ $key }}: {{ $value | quote }}
  {{- end }}
{{- end -}}

{{/* A config value as its flag/environment text: whole numbers without an exponent (YAML
numbers reach templates as floats), booleans as true/false. */}}
{{- define "kbroker.configValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Pod annotations that roll the pods when their ConfigMap or generated security files
change. Call with (list $ "role"). */}}
{{- define "kbroker.configChecksum" -}}
checksum/config: {{ include "kbroker.configMap" . | sha256sum }}
{{- include "kbroker.securityChecksums" . }}
{{- end -}}

{{/* Ports a container exposes besides Kafka: grpc and metrics. Call with (list grpc metrics). */}}
{{- define "kbroker.serviceContainerPorts" -}}
- name: grpc
  containerPort: {{ index . 0 }}
  protocol: TCP
- name: metrics
  containerPort: {{ index . 1 }}
  protocol: TCP
{{- end -}}

{{/* The /tmp volume (the root filesystem is read-only). */}}
{{- define "kbroker.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "kbroker.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* topologySpreadConstraints of a role: the role's own list, else the chart-wide one; each
constraint without a labelSelector selects the role's pods. Call with (list $ roleValues "role"). */}}
{{- define "kbroker.topologySpread" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- $name := index . 2 -}}
{{- $constraints := $role.topologySpreadConstraints | default $.Values.topologySpreadConstraints -}}
{{- with $constraints }}
topologySpreadConstraints:
{{- range . }}
  - {{- toYaml (omit . "labelSelector") | nindent 4 }}
    labelSelector:
      {{- if .labelSelector }}
      {{- toYaml .labelSelector | nindent 6 }}
      {{- else }}
      matchLabels:
        {{- include "kbroker.selectorLabels" (list $ $name) | nindent 8 }}
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}
