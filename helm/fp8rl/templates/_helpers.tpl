{{/*
Names. The full name is cut to 54 characters so that the head Service KubeRay derives from the
RayCluster name, "<name>-head-svc", stays a valid 63-character DNS label.
*/}}
{{- define "fp8rl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 54 | trimSuffix "-" }}
{{- end }}

{{- define "fp8rl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fp8rl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fp8rl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fp8rl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fp8rl.labels" -}}
helm.sh/chart: {{ include "fp8rl.chart" . }}
{{ include "fp8rl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "fp8rl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fp8rl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fp8rl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/* The RayCluster (mode=cluster) and its head Service, as KubeRay names it. */}}
{{- define "fp8rl.rayClusterName" -}}
{{- include "fp8rl.fullname" . }}
{{- end }}

{{- define "fp8rl.rayDashboardAddress" -}}
{{- printf "http://%s-head-svc.%s.svc:8265" (include "fp8rl.rayClusterName" .) .Release.Namespace }}
{{- end }}

{{- define "fp8rl.claimName" -}}
{{- default (printf "%s-data" (include "fp8rl.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{- define "fp8rl.apiSecretName" -}}
{{- printf "%s-api" (include "fp8rl.fullname" .) }}
{{- end }}

{{- define "fp8rl.tokenSecretName" -}}
{{- default (include "fp8rl.apiSecretName" .) .Values.api.auth.existingSecret }}
{{- end }}

{{- define "fp8rl.jobConfigMapName" -}}
{{- printf "%s-job" (include "fp8rl.fullname" .) }}
{{- end }}

{{/* Where the JobSpec ConfigMap is mounted on the head (mode=job). */}}
{{- define "fp8rl.jobSpecDir" -}}
/etc/fp8rl/job
{{- end }}

{{/* The data volume: the claim, or an emptyDir when persistence is off. */}}
{{- define "fp8rl.dataVolume" -}}
- name: data
{{- if .Values.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "fp8rl.claimName" . }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}

{{/* Environment of every Ray container, then the user's extraEnv. */}}
{{- define "fp8rl.rayEnv" -}}
- name: PYTHONUNBUFFERED
  value: "1"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* `ray start` parameters: KubeRay's CRD wants string values. Call with the mapping. */}}
{{- define "fp8rl.rayStartParams" -}}
{{- $params := dict }}
{{- range $key, $value := . }}
{{- $_ := set $params $key (toString $value) }}
{{- end }}
{{- toYaml $params }}
{{- end }}

{{/*
A worker group: workerDefaults with the group's own keys laid over it, key by key.
Call with (dict "root" $ "group" $group); returns YAML (use fromYaml).
*/}}
{{- define "fp8rl.workerGroup" -}}
{{- $group := deepCopy .root.Values.workerDefaults }}
{{- range $key, $value := .group }}
{{- $_ := set $group $key $value }}
{{- end }}
{{- toYaml $group }}
{{- end }}

{{/*
Container resources of a worker: its CPU/memory plus `gpus` of `gpuResource` as request and limit.
Call with the merged group.
*/}}
{{- define "fp8rl.workerResources" -}}
{{- $res := deepCopy (default dict .resources) }}
{{- if gt (int .gpus) 0 }}
{{- $limits := deepCopy (default dict $res.limits) }}
{{- $requests := deepCopy (default dict $res.requests) }}
{{- $_ := set $limits .gpuResource (int .gpus) }}
{{- $_ := set $requests .gpuResource (int .gpus) }}
{{- $_ := set $res "limits" $limits }}
{{- $_ := set $res "requests" $requests }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{/* The memory-backed /dev/shm volume of a Ray pod. Call with the size. */}}
{{- define "fp8rl.shmVolume" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ . }}
{{- end }}

{{/* Pod-level settings shared by every pod of the chart. */}}
{{- define "fp8rl.podCommon" -}}
serviceAccountName: {{ include "fp8rl.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
