{{/*
Object names are fixed, as in config/: the manager's defaults name its webhook configuration
(redline-pod-injector), Service (redline-webhook-service) and self-signed Secret
(redline-webhook-self-signed), and the CRD and webhook are cluster-wide, so a cluster runs one
Redline release.
*/}}

{{- define "redline.labels" -}}
app.kubernetes.io/name: redline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "redline.managerSelector" -}}
app.kubernetes.io/name: redline
app.kubernetes.io/component: manager
{{- end }}


{{- define "redline.managerImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "redline.sidecarImage" -}}
{{ .Values.sidecar.image.repository }}:{{ .Values.sidecar.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A webhook's namespace selector: (dict "root" $ "hook" <the entry of config/>). The release
namespace, kube-system and kube-node-lease are always excluded (the manager must never depend on
its own injection, nor the control plane on Redline); config/'s other expressions (which keep the
pod and namespace opt-ins apart) follow, then the user's. */}}
{{- define "redline.namespaceSelector" -}}
{{- $root := .root -}}
{{- $sel := deepCopy ($root.Values.webhook.namespaceSelector | default dict) -}}
{{- $exprs := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list "kube-system" "kube-node-lease" $root.Release.Namespace)) -}}
{{- range ((.hook.namespaceSelector | default dict).matchExpressions | default list) }}{{ if ne .key "kubernetes.io/metadata.name" }}{{ $exprs = append $exprs . }}{{ end }}{{ end -}}
{{- range ($sel.matchExpressions | default list) }}{{ $exprs = append $exprs . }}{{ end -}}
{{- $_ := set $sel "matchExpressions" $exprs -}}
{{- toYaml $sel -}}
{{- end }}

{{/* One object of a file in files/config, the copy of config/ that make chart-sync writes:
(dict "root" $ "file" "rbac/role.yaml" "kind" "ClusterRole"). A file may hold several
documents; the first of the kind is returned. */}}
{{- define "redline.configObject" -}}
{{- $found := dict -}}
{{- $raw := .root.Files.Get (printf "files/config/%s" .file) -}}
{{- if not $raw }}{{ fail (printf "files/config/%s is missing: run make chart-sync" .file) }}{{ end -}}
{{- range $doc := splitList "\n---" $raw -}}
{{- $obj := fromYaml $doc -}}
{{- if and (eq ($obj.kind | default "") $.kind) (not $found.kind) }}{{ $found = $obj }}{{ end -}}
{{- end -}}
{{- if not $found.kind }}{{ fail (printf "files/config/%s has no %s: run make chart-sync" .file .kind) }}{{ end -}}
{{- toYaml $found -}}
{{- end }}
