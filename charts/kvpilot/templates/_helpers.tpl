{{/*
Names, labels and the operator's permissions, shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "kvpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of object names: "<release>-<chart>", or just the release name when it already contains
the chart name (so `helm install kvpilot ...` gives "kvpilot", not "kvpilot-kvpilot").
*/}}
{{- define "kvpilot.fullname" -}}
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

{{/* "<chart>-<version>" for the helm.sh/chart label ("+" is not allowed in label values). */}}
{{- define "kvpilot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels that select the operator pod. component=operator keeps the selector apart from the engine
pods the operator creates (they carry app.kubernetes.io/component=server).
*/}}
{{- define "kvpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The recommended app.kubernetes.io/* labels plus helm.sh/chart, for every object of the chart. */}}
{{- define "kvpilot.labels" -}}
helm.sh/chart: {{ include "kvpilot.chart" . }}
{{ include "kvpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kvpilot
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "kvpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvpilot.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "kvpilot.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The simulated-backend image handed to the operator with --kvsim-image. */}}
{{- define "kvpilot.kvsimImage" -}}
{{- printf "%s:%s" .Values.kvsimImage.repository (default .Chart.AppVersion .Values.kvsimImage.tag) }}
{{- end }}

{{/* The watched namespaces, de-duplicated and sorted so the output is stable. */}}
{{- define "kvpilot.watchNamespaces" -}}
{{- .Values.watchNamespaces | uniq | sortAlpha | toJson }}
{{- end }}

{{/* The operator's command-line arguments after `kvpilot`. */}}
{{- define "kvpilot.args" -}}
- run
{{- $namespaces := include "kvpilot.watchNamespaces" . | fromJsonArray }}
{{- if $namespaces }}
{{- range $namespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --metrics-port
- {{ .Values.metrics.port | quote }}
- --health-port
- {{ .Values.health.port | quote }}
- --kvsim-image
- {{ include "kvpilot.kvsimImage" . | quote }}
- --log-format
- {{ .Values.logFormat | quote }}
- --resync-seconds
- {{ .Values.resyncSeconds | quote }}
{{- if not .Values.gpuCapacity.watch }}
- --no-gpu-capacity
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs in every namespace it watches. They are used verbatim by the cluster-wide
ClusterRole and by each per-namespace Role. docs/install.md has the reason for each line; keep the two
in sync. No wildcards: every group, resource and verb is named.
*/}}
{{- define "kvpilot.rbac.namespacedRules" -}}
# The InferenceEngine itself: read and watch it only. The operator never writes it (no finalizer, no
# annotations: kopf runs event handlers only), so GitOps tools own every byte of it.
- apiGroups: ["serving.kvpilot.io"]
  resources: ["inferenceengines"]
  verbs: ["get", "list", "watch"]
# Its status (merge patches): the conditions, the engine in force, status.batching (the tuned batch size).
- apiGroups: ["serving.kvpilot.io"]
  resources: ["inferenceengines/status"]
  verbs: ["get", "patch"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers subresource.
- apiGroups: ["serving.kvpilot.io"]
  resources: ["inferenceengines/finalizers"]
  verbs: ["update"]
# Engine build Jobs: created once per fingerprint; patched to add an owner when another engine shares it.
# Never deleted by the operator: the garbage collector and the Job's TTL do that.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The serving Deployment of trtllm-serve pods.
# Server-side apply creates (create) and updates (patch); children are deleted by the garbage collector.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The serving Deployment's ReplicaSets, read only: a pod's metrics count only if its owner chain leads through
# one of them to the engine's Deployment (issue 22: pods wearing an engine's labels do not steer its tuner).
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get", "list", "watch"]
# The engine's Service, its rendered LLM-API config, the engine index, and the engine-cache PVC it may create.
- apiGroups: [""]
  resources: ["services", "configmaps", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The serving pods' PodDisruptionBudget (engines with more than one replica): a node drain evicts one at a time.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Multi-node engines (docs/multinode.md): the LeaderWorkerSet that runs each replica as a group of pods.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Their ranks' SSH keys: generated by the operator and created once. Never read, listed or patched: the
# operator reads no Secret (pods mount them).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Engine pods: readiness, scheduling failures, and the pod IPs whose metrics it reads.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Events about each InferenceEngine (kopf posts core/v1 Events; the operator may use events.k8s.io).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
What kopf itself reads at cluster scope. kopf 1.45 watches CRDs to notice resources appearing and
disappearing (kopf/_core/reactor/observation.py, resource_observer), in every mode.
*/}}
{{- define "kvpilot.rbac.kopfClusterRules" -}}
# kopf: notice the InferenceEngine CRD being created, upgraded or removed at runtime.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.gpuCapacity.watch }}
# serving.rollout.strategy Auto: free GPUs per node (allocatable minus the GPU requests of the pods bound
# there, in any namespace), so a retune surges only where the scheduler can place the extra pod.
- apiGroups: [""]
  resources: ["nodes", "pods"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
