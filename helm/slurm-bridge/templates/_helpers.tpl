{{/*
Names, labels and small pieces shared by every template (and by
admission-webhooks.yaml, which is maintained with the webhook).
*/}}

{{- define "slurm-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: "<release>-<chart>", or just the release name when it already
contains the chart name (so `helm install slurm-bridge .` gives "slurm-bridge").
Truncated to 55 so "-webhook" still fits into a 63-character name.
*/}}
{{- define "slurm-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slurm-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slurm-bridge.labels" -}}
helm.sh/chart: {{ include "slurm-bridge.chart" . }}
app.kubernetes.io/name: {{ include "slurm-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component; call with (dict "context" $ "component" "worker"). */}}
{{- define "slurm-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slurm-bridge.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "slurm-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Worker */}}
{{- define "slurm-bridge.worker.fullname" -}}
{{- include "slurm-bridge.fullname" . }}
{{- end }}

{{- define "slurm-bridge.worker.serviceAccountName" -}}
{{- if .Values.worker.serviceAccount.create }}
{{- default (include "slurm-bridge.fullname" .) .Values.worker.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.worker.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Kubernetes username of the worker: the webhook lets only it write the bridge-owned label and annotation. */}}
{{- define "slurm-bridge.worker.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "slurm-bridge.worker.serviceAccountName" .) }}
{{- end }}

{{/* Webhook */}}
{{- define "slurm-bridge.webhook.fullname" -}}
{{- printf "%s-webhook" (include "slurm-bridge.fullname" .) }}
{{- end }}

{{- define "slurm-bridge.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create }}
{{- default (include "slurm-bridge.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Service the API server calls (port 443). */}}
{{- define "slurm-bridge.webhook.serviceName" -}}
{{- include "slurm-bridge.webhook.fullname" . }}
{{- end }}

{{/* The cert-manager Certificate of the serving certificate ("<namespace>/<name>" for cert-manager.io/inject-ca-from). */}}
{{- define "slurm-bridge.webhook.certificateName" -}}
{{- include "slurm-bridge.webhook.fullname" . }}
{{- end }}

{{- define "slurm-bridge.webhook.injectCAFrom" -}}
{{- printf "%s/%s" .Release.Namespace (include "slurm-bridge.webhook.certificateName" .) }}
{{- end }}

{{- define "slurm-bridge.webhook.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "slurm-bridge.webhook.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{/*
The webhook configurations' CA: cert-manager injects it (annotation from
"slurm-bridge.webhook.injectCAFrom"); without cert-manager it is given.
*/}}
{{- define "slurm-bridge.webhook.caBundle" -}}
{{- if not .Values.webhook.certManager.enabled }}
{{- required "webhook.tls.caBundle is required when webhook.certManager.enabled is false" .Values.webhook.tls.caBundle }}
{{- end }}
{{- end }}

{{/*
webhook.managedNamespaceSelector (a metav1.LabelSelector object) in the string
form `slurm-bridge webhook` reads from MANAGED_NAMESPACE_SELECTOR:
matchLabels a: b -> "a=b"; In -> "k in (x,y)"; NotIn -> "k notin (x,y)";
Exists -> "k"; DoesNotExist -> "!k". Empty when no selector is set.
*/}}
{{- define "slurm-bridge.webhook.selectorString" -}}
{{- $selector := .Values.webhook.managedNamespaceSelector | default dict }}
{{- $parts := list }}
{{- range $key, $value := $selector.matchLabels | default dict }}
{{- $parts = append $parts (printf "%s=%s" $key $value) }}
{{- end }}
{{- range $selector.matchExpressions | default list }}
{{- if eq .operator "In" }}
{{- $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq .operator "NotIn" }}
{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq .operator "Exists" }}
{{- $parts = append $parts .key }}
{{- else if eq .operator "DoesNotExist" }}
{{- $parts = append $parts (printf "!%s" .key) }}
{{- end }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{/*
The worker's Temporal TLS files: Secret volumes mounted whole (no subPath), so
the kubelet refreshes them when the Secret changes and the worker reconnects
with them (TEMPORAL_CREDENTIALS_RELOAD_INTERVAL) without a restart.
*/}}
{{/*
dra.deviceClasses in the compact form the worker and the webhook read from
DRA_DEVICE_CLASSES: "<class>=cpu" or "<class>=<gres>[:<type>]", comma-joined
(empty: no class is honoured). A class listed twice fails the render.
*/}}
{{- define "slurm-bridge.draDeviceClasses" -}}
{{- $parts := list }}
{{- $seen := dict }}
{{- range .Values.dra.deviceClasses }}
{{- if hasKey $seen .name }}
{{- fail (printf "dra.deviceClasses: %s is listed twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- if .gres }}
{{- $parts = append $parts (printf "%s=%s%s" .name .gres.name (ternary (printf ":%s" .gres.type) "" (not (empty .gres.type)))) }}
{{- else }}
{{- $parts = append $parts (printf "%s=%s" .name .slurm) }}
{{- end }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{- /* The tenant policy: directory of the mounted ConfigMap, and the file the worker and webhook read. */ -}}
{{- define "slurm-bridge.tenantPolicyDir" -}}/etc/slurm-bridge/tenant-policy{{- end }}
{{- define "slurm-bridge.tenantPolicyFile" -}}
{{- if .Values.tenantPolicy.enabled }}{{ include "slurm-bridge.tenantPolicyDir" . }}/policy.yaml{{ end }}
{{- end }}
{{- define "slurm-bridge.worker.temporalMtlsDir" -}}/var/run/secrets/temporal-mtls{{- end }}
{{- define "slurm-bridge.worker.temporalCaDir" -}}/var/run/secrets/temporal-ca{{- end }}

{{/* The worker ConfigMap's Temporal TLS and tuning settings; empty file settings mean "not used". */}}
{{- define "slurm-bridge.worker.temporalConfig" -}}
{{- $t := .Values.temporal }}
TEMPORAL_TLS_CERT_FILE: {{ ternary (printf "%s/tls.crt" (include "slurm-bridge.worker.temporalMtlsDir" .)) "" (not (empty $t.mtls.secretName)) | quote }}
TEMPORAL_TLS_KEY_FILE: {{ ternary (printf "%s/tls.key" (include "slurm-bridge.worker.temporalMtlsDir" .)) "" (not (empty $t.mtls.secretName)) | quote }}
TEMPORAL_TLS_CA_FILE: {{ ternary (printf "%s/ca.crt" (include "slurm-bridge.worker.temporalCaDir" .)) "" (not (empty $t.caSecret.name)) | quote }}
TEMPORAL_TLS_SERVER_NAME: {{ $t.serverName | quote }}
TEMPORAL_CREDENTIALS_RELOAD_INTERVAL: {{ $t.credentialsReloadInterval | quote }}
TEMPORAL_MAX_CONCURRENT_ACTIVITIES: {{ .Values.worker.maxConcurrentActivities | quote }}
TEMPORAL_MAX_CONCURRENT_WORKFLOW_TASKS: {{ .Values.worker.maxConcurrentWorkflowTasks | quote }}
TEMPORAL_MAX_CACHED_WORKFLOWS: {{ .Values.worker.maxCachedWorkflows | quote }}
TEMPORAL_STICKY_TIMEOUT: {{ .Values.worker.stickyTimeout | quote }}
{{- end }}
