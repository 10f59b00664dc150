{{/* Common labels of every object. */}}
{{- define "tendril.labels" -}}
app.kubernetes.io/part-of: tendril
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* An image: tendril.image (list $ "agent"). */}}
{{- define "tendril.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" $root.Values.image.repository (index . 1) ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}

{{/* Paths inside the agent container. */}}
{{- define "tendril.socket" -}}/var/run/tendril/tendril.sock{{- end -}}
{{- define "tendril.hubbleTLSDir" -}}/var/lib/tendril/tls/hubble{{- end -}}
{{- define "tendril.kvstoreTLSDir" -}}/var/lib/tendril/tls/kvstore{{- end -}}

{{/* encryption.* are read with dig: `helm upgrade --reuse-values` from a
release whose chart had no encryption values leaves .Values.encryption
unset (the new chart's defaults are not merged in). */}}
{{- define "tendril.encryptionEnabled" -}}
{{- if dig "enabled" false (.Values.encryption | default dict) }}true{{ end -}}
{{- end -}}

{{/* The cluster-wide checks of values the schema cannot express. */}}
{{- define "tendril.validate" -}}
{{- if and (eq .Values.identityAllocationMode "kvstore") (not .Values.kvstore.endpoints) -}}
{{- fail "identityAllocationMode kvstore needs kvstore.endpoints" -}}
{{- end -}}
{{- if and (eq .Values.ipam.mode "cluster-pool") (not .Values.ipam.clusterPoolIPv4CIDRs) -}}
{{- fail "ipam.mode cluster-pool needs ipam.clusterPoolIPv4CIDRs" -}}
{{- end -}}
{{- if and .Values.hubble.relay.enabled (not .Values.hubble.enabled) -}}
{{- fail "hubble.relay.enabled needs hubble.enabled" -}}
{{- end -}}
{{- $enc := .Values.encryption | default dict -}}
{{- if and (not (dig "enabled" false $enc)) (or (dig "strictMode" "enabled" false $enc) (dig "nodeEncryption" false $enc)) -}}
{{- fail "encryption.strictMode.enabled and encryption.nodeEncryption need encryption.enabled" -}}
{{- end -}}
{{- if and .Values.ui.enabled (not (and .Values.hubble.enabled .Values.hubble.relay.enabled)) -}}
{{- fail "ui.enabled needs hubble.enabled and hubble.relay.enabled (the UI reads the relay)" -}}
{{- end -}}
{{- end -}}
