{{/*
The webhooks' namespaceSelector: the namespaces listed in webhook.namespaces, else those labelled
webhook.namespaceLabel; never gpuslice's own namespace nor kube-system.
*/}}
{{- define "gpuslice.namespaceSelector" -}}
matchExpressions:
{{- if .Values.webhook.namespaces }}
- key: kubernetes.io/metadata.name
  operator: In
  values:
  {{- range .Values.webhook.namespaces }}
  - {{ . | quote }}
  {{- end }}
{{- else }}
- key: {{ .Values.webhook.namespaceLabel.key }}
  operator: In
  values:
  - {{ .Values.webhook.namespaceLabel.value | quote }}
{{- end }}
- key: kubernetes.io/metadata.name
  operator: NotIn
  values:
  - gpuslice
  - kube-system
{{- end }}
