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

{{- /* The manager's ClusterRole rules from config/, with the namespaces' credentials Secret
named as sidecar.redisSecret names it: config/ names the default, redline-redis; the manager
reads and writes the Secret --sidecar-redis-secret names (none when it is empty). */ -}}
{{- define "redline.managerClusterRules" -}}
{{- $rules := list }}
{{- range (include "redline.configObject" (dict "root" . "file" "rbac/role.yaml" "kind" "ClusterRole") | fromYaml).rules }}
{{- $rule := . }}
{{- if has "redline-redis" (.resourceNames | default list) }}
{{- $names := list }}
{{- range .resourceNames }}
{{- if ne . "redline-redis" }}
{{- $names = append $names . }}
{{- else if $.Values.sidecar.redisSecret }}
{{- $names = append $names $.Values.sidecar.redisSecret }}
{{- end }}
{{- end }}
{{- $rule = merge (dict "resourceNames" ($names | uniq)) (omit . "resourceNames") }}
{{- end }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- toYaml $rules }}
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

{{/* What the schema cannot say about redis.tls, checked before anything renders: TLS settings
need a TLS scheme (the scheme turns TLS on; the settings only refine it), a client certificate
needs a Secret to come from, and sidecars on the manager's Redis need its CA too. The manager
checks the same at start; failing here keeps a running release from being upgraded into it. */}}
{{- define "redline.validateRedisTLS" -}}
{{- $tls := .Values.redis.tls | default dict -}}
{{- $set := or $tls.secretName $tls.sidecarSecretName $tls.clientCertificate $tls.serverName (eq ($tls.minVersion | default "") "1.3") -}}
{{- if and $set (not (hasPrefix "rediss" .Values.redis.url)) -}}
{{- fail (printf "redis.tls is set but redis.url (%s) does not use TLS: use rediss:// or rediss+sentinel://" .Values.redis.url) -}}
{{- end -}}
{{- if and $tls.clientCertificate (not $tls.secretName) -}}
{{- fail "redis.tls.clientCertificate needs redis.tls.secretName, the Secret with the manager's tls.crt and tls.key" -}}
{{- end -}}
{{- if and $tls.clientCertificate (not $tls.sidecarSecretName) (not .Values.sidecar.redisUrl) -}}
{{- fail "redis.tls.clientCertificate needs redis.tls.sidecarSecretName too: sidecars on the same Redis must present a certificate of their namespace" -}}
{{- end -}}
{{- if and $tls.secretName (not $tls.sidecarSecretName) (not .Values.sidecar.redisUrl) -}}
{{- fail "redis.tls.secretName is set but redis.tls.sidecarSecretName is not: sidecars use the same Redis and need its CA, from a Secret of that name in each namespace" -}}
{{- end -}}
{{- end }}
