{{/* The namespace every namespaced object goes to. */}}
{{- define "lockstep.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/* Labels on every object: deploy/'s app.kubernetes.io/part-of, plus Helm's own. */}}
{{- define "lockstep.labels" -}}
app.kubernetes.io/part-of: lockstep
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "lockstep.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
