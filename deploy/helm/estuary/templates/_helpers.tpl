{{/* Names and labels, as `helm create` makes them. */}}
{{- define "estuary.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "estuary.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "estuary.selectorLabels" -}}
app.kubernetes.io/name: {{ include "estuary.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "estuary.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "estuary.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The namespace whose Secrets estuary reads: remote secrets live there. */}}
{{- define "estuary.secretNamespace" -}}
{{- .Values.secretNamespace | default .Release.Namespace -}}
{{- end -}}

{{/*
An HCL string literal. JSON's escapes are HCL's; only template sequences
("${", "%{") must be doubled so a value is never interpolated.
*/}}
{{- define "estuary.hcl" -}}
{{- . | toString | replace "${" "$${" | replace "%{" "%%{" | toJson -}}
{{- end -}}

{{/* An HCL list of strings. */}}
{{- define "estuary.hclList" -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "estuary.hcl" $v }}{{ end }}]
{{- end -}}

{{/* The xDS port and listen address: TLS on 15012, plain text on 15010. */}}
{{- define "estuary.xdsPort" -}}
{{- if .Values.xds.tls.enabled }}15012{{ else }}15010{{ end -}}
{{- end -}}

{{- define "estuary.xdsListen" -}}
{{- if or .Values.xds.tls.enabled .Values.xds.insecure -}}
:{{ include "estuary.xdsPort" . }}
{{- else -}}
127.0.0.1:15010
{{- end -}}
{{- end -}}

{{/* Whether the xDS Service has a port to serve: not for loopback-only plain text. */}}
{{- define "estuary.xdsExposed" -}}
{{- if or .Values.xds.tls.enabled .Values.xds.insecure }}true{{ end -}}
{{- end -}}

{{- define "estuary.xdsTLSSecret" -}}
{{- .Values.xds.tls.secretName | default (printf "%s-xds-tls" (include "estuary.fullname" .)) -}}
{{- end -}}

{{- define "estuary.adminTokenSecret" -}}
{{- .Values.admin.tokenSecretName | default (printf "%s-admin-token" (include "estuary.fullname" .)) -}}
{{- end -}}

{{/* Whether any enabled plugin reads this cluster's API server. */}}
{{- define "estuary.readsKubernetes" -}}
{{- if or .Values.plugins.kubernetes.enabled .Values.plugins.serviceentry.enabled }}true{{ end -}}
{{- end -}}
