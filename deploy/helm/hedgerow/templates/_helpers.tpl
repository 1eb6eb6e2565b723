{{/*
The name every object starts with: the release's (install it as
`hedgerow` to get the names deploy/k8s uses: hedgerow-gateway, ...).
*/}}
{{- define "hedgerow.fullname" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels of every object's metadata: those of deploy/k8s (part-of) and
Helm's own. Pod templates carry only the first, so a new chart version
does not roll the Pods.
*/}}
{{- define "hedgerow.labels" -}}
app.kubernetes.io/part-of: hedgerow
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* The image, its tag the chart's appVersion unless set. */}}
{{- define "hedgerow.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
A role's terminationGracePeriodSeconds: at least the longest policy
deadline of the configuration plus the role's drain and preStop, so
Kubernetes never kills a group in flight that could still finish.
*/}}
{{- define "hedgerow.checkGrace" -}}
{{- $role := index . 0 -}}
{{- $root := index . 1 -}}
{{- range $name, $p := ($root.Values.config.policies | default dict) -}}
{{- $deadline := $p.deadline | default "30s" -}}
{{- if not (regexMatch "^[0-9]+s$" $deadline) -}}
{{- fail (printf "config.policies.%s.deadline %q: the chart reads whole seconds (e.g. 30s)" $name $deadline) -}}
{{- end -}}
{{- if lt (int $role.terminationGracePeriodSeconds) (add (int (trimSuffix "s" $deadline)) (int ($role.preStopSeconds | default 0))) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is below policy %s's deadline %s and the preStop sleep" (int $role.terminationGracePeriodSeconds) $name $deadline) -}}
{{- end -}}
{{- end -}}
{{- end -}}
