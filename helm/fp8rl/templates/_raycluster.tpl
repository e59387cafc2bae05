{{/*
The RayCluster spec, shared by the RayCluster (mode=cluster) and the RayJob's rayClusterSpec
(mode=job): one head (driver, GCS, dashboard; no GPU) and the GPU worker groups. Every Ray pod
mounts the data volume at persistence.mountPath and a memory-backed /dev/shm.
*/}}
{{- define "fp8rl.rayClusterSpec" -}}
{{- $jobMode := eq .Values.mode "job" -}}
rayVersion: {{ .Values.ray.version | quote }}
{{- if .Values.ray.autoscaling.enabled }}
enableInTreeAutoscaling: true
autoscalerOptions:
  idleTimeoutSeconds: {{ .Values.ray.autoscaling.idleTimeoutSeconds }}
  upscalingMode: {{ .Values.ray.autoscaling.upscalingMode }}
{{- end }}
headGroupSpec:
  serviceType: {{ .Values.head.serviceType }}
  {{- if .Values.head.rayStartParams }}
  rayStartParams:
    {{- include "fp8rl.rayStartParams" .Values.head.rayStartParams | nindent 4 }}
  {{- else }}
  rayStartParams: {}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "fp8rl.selectorLabels" . | nindent 8 }}
        app.kubernetes.io/component: ray-head
        {{- with .Values.head.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.head.annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      {{- include "fp8rl.podCommon" . | nindent 6 }}
      containers:
        - name: ray-head
          image: {{ include "fp8rl.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          ports:
            - name: gcs-server
              containerPort: 6379
            - name: dashboard
              containerPort: 8265
            - name: client
              containerPort: 10001
            - name: metrics
              containerPort: 8080
          env:
            {{- include "fp8rl.rayEnv" . | nindent 12 }}
          resources:
            {{- toYaml .Values.head.resources | nindent 12 }}
          volumeMounts:
            - name: dshm
              mountPath: /dev/shm
            - name: data
              mountPath: {{ .Values.persistence.mountPath }}
            {{- if $jobMode }}
            - name: job-spec
              mountPath: {{ include "fp8rl.jobSpecDir" . }}
              readOnly: true
            {{- end }}
      volumes:
        {{- include "fp8rl.shmVolume" .Values.head.shmSize | nindent 8 }}
        {{- include "fp8rl.dataVolume" . | nindent 8 }}
        {{- if $jobMode }}
        - name: job-spec
          configMap:
            name: {{ include "fp8rl.jobConfigMapName" . }}
        {{- end }}
      {{- with .Values.head.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.head.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.head.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
workerGroupSpecs:
{{- $seen := dict }}
{{- range .Values.workerGroups }}
{{- $g := include "fp8rl.workerGroup" (dict "root" $ "group" .) | fromYaml }}
{{- if hasKey $seen $g.name }}
{{- fail (printf "workerGroups: the name %q is used twice; each group needs its own name" $g.name) }}
{{- end }}
{{- $_ := set $seen $g.name true }}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) }}
{{- fail (printf "workerGroups[%s]: minReplicas (%d) must not exceed maxReplicas (%d)" $g.name (int $g.minReplicas) (int $g.maxReplicas)) }}
{{- end }}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) }}
{{- fail (printf "workerGroups[%s]: replicas (%d) must lie between minReplicas (%d) and maxReplicas (%d)" $g.name (int $g.replicas) (int $g.minReplicas) (int $g.maxReplicas)) }}
{{- end }}
  - groupName: {{ $g.name }}
    replicas: {{ int $g.replicas }}
    minReplicas: {{ int $g.minReplicas }}
    maxReplicas: {{ int $g.maxReplicas }}
    {{- if $g.rayStartParams }}
    rayStartParams:
      {{- include "fp8rl.rayStartParams" $g.rayStartParams | nindent 6 }}
    {{- else }}
    rayStartParams: {}
    {{- end }}
    template:
      metadata:
        labels:
          {{- include "fp8rl.selectorLabels" $ | nindent 10 }}
          app.kubernetes.io/component: ray-worker
          {{- with $g.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        {{- with $g.annotations }}
        annotations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      spec:
        {{- include "fp8rl.podCommon" $ | nindent 8 }}
        containers:
          - name: ray-worker
            image: {{ include "fp8rl.image" $ }}
            imagePullPolicy: {{ $.Values.image.pullPolicy }}
            env:
              {{- include "fp8rl.rayEnv" $ | nindent 14 }}
            resources:
              {{- include "fp8rl.workerResources" $g | nindent 14 }}
            volumeMounts:
              - name: dshm
                mountPath: /dev/shm
              - name: data
                mountPath: {{ $.Values.persistence.mountPath }}
        volumes:
          {{- include "fp8rl.shmVolume" $g.shmSize | nindent 10 }}
          {{- include "fp8rl.dataVolume" $ | nindent 10 }}
        {{- with $g.nodeSelector }}
        nodeSelector:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with $g.tolerations }}
        tolerations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with $g.affinity }}
        affinity:
          {{- toYaml . | nindent 10 }}
        {{- end }}
{{- end }}
{{- end }}
