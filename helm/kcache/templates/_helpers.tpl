{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "kcache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: release name, plus the chart name unless the release already holds it.
*/}}
{{- define "kcache.fullname" -}}
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

{{- define "kcache.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kcache.labels" -}}
helm.sh/chart: {{ include "kcache.chart" . }}
{{ include "kcache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: server
app.kubernetes.io/part-of: kcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kcache.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kcache.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The Secret holding tokens.json (and optionally S3 credentials / the Redis URL).
*/}}
{{- define "kcache.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- include "kcache.fullname" . }}
{{- end }}
{{- end }}

{{/*
A value as an environment-variable string. YAML numbers reach templates as float64, which
toString would print as 1.073741824e+09: whole numbers are printed as integers instead.
*/}}
{{- define "kcache.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
{{- int64 . | toString }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{- define "kcache.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Cross-field checks that values.schema.json cannot express. Included from deployment.yaml, so a
misconfiguration fails `helm template` / `helm install` before anything reaches the cluster.
*/}}
{{- define "kcache.validate" -}}
{{- if not .Values.config.blobUrl }}
{{- fail "config.blobUrl is required: the chart deploys the stateless profile, blobs in S3 (s3://bucket/prefix)" }}
{{- end }}
{{- if and (not .Values.config.indexUrl) (not .Values.secret.indexUrl) (not .Values.secret.existingSecret) }}
{{- fail "config.indexUrl (or secret.indexUrl, or KCACHE_INDEX_URL in secret.existingSecret) is required: redis://, rediss:// or redis+cluster://" }}
{{- end }}
{{- if and (not .Values.secret.existingSecret) (empty .Values.secret.tokens) }}
{{- fail "bearer tokens are required (the server refuses to listen on 0.0.0.0 without them): set secret.tokens or secret.existingSecret" }}
{{- end }}
{{- if and (not .Values.secret.existingSecret) (ne (empty .Values.secret.awsAccessKeyId) (empty .Values.secret.awsSecretAccessKey)) }}
{{- fail "set both secret.awsAccessKeyId and secret.awsSecretAccessKey, or neither" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set only one of minAvailable / maxUnavailable (null the other)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- end }}
