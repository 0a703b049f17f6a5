{{/* Chart name, truncated to the 63 characters of a label value. */}}
{{- define "turnout.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name when it already contains the chart's. */}}
{{- define "turnout.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "turnout.selectorLabels" -}}
app.kubernetes.io/name: {{ include "turnout.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "turnout.labels" -}}
{{ include "turnout.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: router
app.kubernetes.io/part-of: turnout
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The admin Service's labels: the ServiceMonitor selects it by its component. */}}
{{- define "turnout.adminLabels" -}}
{{ include "turnout.labels" . | replace "app.kubernetes.io/component: router" "app.kubernetes.io/component: admin" }}
{{- end -}}

{{- define "turnout.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "turnout.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The directory turnout renders the proxy's files into, shared with it. */}}
{{- define "turnout.proxyDir" -}}
/run/turnout/{{ .Values.proxy }}
{{- end -}}

{{/* "true" when a pool sorts pods by role_label or follows an InferencePool:
turnout then reads pods too. */}}
{{- define "turnout.needsPods" -}}
{{- $need := false -}}
{{- range .Values.deployments -}}
{{- range .pools -}}
{{- if and .discovery .discovery.kubernetes (or .discovery.kubernetes.role_label .discovery.kubernetes.inference_pool) -}}
{{- $need = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $need }}true{{ end -}}
{{- end -}}

{{/* "true" when a pool follows an InferencePool (discovery.kubernetes.inference_pool). */}}
{{- define "turnout.needsInferencePools" -}}
{{- $need := false -}}
{{- range .Values.deployments -}}
{{- range .pools -}}
{{- if and .discovery .discovery.kubernetes .discovery.kubernetes.inference_pool -}}
{{- $need = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $need }}true{{ end -}}
{{- end -}}

{{/* Namespaces discovery reads: rbac.namespaces, else the release namespace
plus every namespace a pool's discovery names. */}}
{{- define "turnout.watchNamespaces" -}}
{{- $ns := list -}}
{{- if .Values.rbac.namespaces -}}
{{- $ns = .Values.rbac.namespaces -}}
{{- else -}}
{{- $ns = list .Release.Namespace -}}
{{- range .Values.deployments -}}
{{- range .pools -}}
{{- if and .discovery .discovery.kubernetes .discovery.kubernetes.namespace -}}
{{- $ns = append $ns .discovery.kubernetes.namespace -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* turnout.yaml: the chart's listeners and proxy settings, the values'
deployments, then .Values.config merged over them. */}}
{{- define "turnout.config" -}}
{{- $dir := include "turnout.proxyDir" . -}}
{{- $drain := printf "%ds" (int .Values.drainTimeoutSeconds) -}}
{{- $cfg := dict "listen" .Values.turnout.listen "admin_listen" (printf ":%d" (int .Values.turnout.adminPort)) -}}
{{- if ne .Values.proxy "epp" -}}
{{- $_ := set $cfg "feedback" (dict "syslog" "127.0.0.1:9514" "token_file" (include "turnout.feedbackTokenFile" .)) -}}
{{- end -}}
{{- if eq .Values.proxy "haproxy" -}}
{{- $_ := set $cfg "haproxy" (dict "listen" (printf "0.0.0.0:%d" (int .Values.proxyPort)) "dir" $dir "drain_timeout" $drain) -}}
{{- else if eq .Values.proxy "nginx" -}}
{{- $_ := set $cfg "nginx" (dict "listen" (printf "0.0.0.0:%d" (int .Values.proxyPort)) "dir" $dir "mode" .Values.nginx.mode "drain_timeout" $drain) -}}
{{- else if eq .Values.proxy "epp" -}}
{{- $_ := set $cfg "epp" (include "turnout.eppConfig" . | fromYaml) -}}
{{- else -}}
{{- fail (printf "proxy must be haproxy, nginx or epp, not %q" .Values.proxy) -}}
{{- end -}}
{{- $_ := set $cfg "deployments" .Values.deployments -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy .Values.config)) -}}
{{- end -}}

{{/* turnout's epp: section with proxy: epp (the gateway's ext_proc target,
plaintext health for the kubelet, TLS from the values). */}}
{{- define "turnout.eppConfig" -}}
listen: {{ printf "0.0.0.0:%d" (int .Values.epp.port) | quote }}
health_listen: {{ printf "0.0.0.0:%d" (int .Values.epp.healthPort) | quote }}
tls:
  mode: {{ .Values.epp.tls.mode | quote }}
  {{- if eq .Values.epp.tls.mode "files" }}
  cert_file: {{ include "turnout.eppTLSDir" . }}/tls.crt
  key_file: {{ include "turnout.eppTLSDir" . }}/tls.key
  {{- end }}
{{- end -}}

{{/* The Secret holding the feedback token: feedback.tokenSecret.name, else
the one the chart creates. */}}
{{- define "turnout.feedbackSecret" -}}
{{- default (printf "%s-feedback" (include "turnout.fullname" .)) .Values.feedback.tokenSecret.name -}}
{{- end -}}

{{/* Where the feedback token Secret is mounted (read-only). */}}
{{- define "turnout.feedbackTokenDir" -}}
/etc/turnout-feedback
{{- end -}}

{{/* turnout's feedback.token_file: the Secret's key in its mount. */}}
{{- define "turnout.feedbackTokenFile" -}}
{{ include "turnout.feedbackTokenDir" . }}/{{ .Values.feedback.tokenSecret.key }}
{{- end -}}

{{/* Where the epp.tls.secretName Secret is mounted (mode files). */}}
{{- define "turnout.eppTLSDir" -}}
/etc/turnout-tls
{{- end -}}

{{/* The Service port's appProtocol for the Endpoint Picker: gateways dial
it over TLS (http2) or plaintext HTTP/2 (kubernetes.io/h2c). */}}
{{- define "turnout.eppAppProtocol" -}}
{{- if eq .Values.epp.tls.mode "off" -}}
kubernetes.io/h2c
{{- else -}}
http2
{{- end -}}
{{- end -}}

{{/* The securityContext every container gets: restricted Pod Security. */}}
{{- define "turnout.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
