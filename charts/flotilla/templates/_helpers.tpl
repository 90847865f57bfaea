{{/*
The chart's name, or nameOverride.
*/}}
{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources: fullnameOverride, else
<release>-<chart> (or just <release> when it already holds the chart name).
Kept to 52 characters so suffixes such as "-migration" stay within 63.
*/}}
{{- define "flotilla.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart-version, for the helm.sh/chart label.
*/}}
{{- define "flotilla.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels. Call with (dict "root" $ "component" "worker").
*/}}
{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/*
Every resource's labels. Call with (dict "root" $ "component" "worker"), the
component may be "".
*/}}
{{- define "flotilla.labels" -}}
helm.sh/chart: {{ include "flotilla.chart" .root }}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: flotilla
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The service account of the workers and relays.
*/}}
{{- define "flotilla.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flotilla.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image, tag defaulting to the appVersion.
*/}}
{{- define "flotilla.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/*
Chart-made Secret names.
*/}}
{{- define "flotilla.databaseSecret" -}}
{{- printf "%s-database" (include "flotilla.fullname" .) }}
{{- end }}
{{- define "flotilla.migrationSecret" -}}
{{- printf "%s-migration" (include "flotilla.fullname" .) }}
{{- end }}
{{- define "flotilla.credentialsSecret" -}}
{{- printf "%s-credentials" (include "flotilla.fullname" .) }}
{{- end }}
{{- define "flotilla.kafkaPropertiesSecret" -}}
{{- printf "%s-kafka-properties" (include "flotilla.fullname" .) }}
{{- end }}

{{/*
The secret references of the chart, as a YAML list, each item:
  ref:     the values object {value, existingSecret, existingSecretKey}
  key:     the key in the Secret the chart creates
  store:   "database" (the database Secret, copied for the migration hook)
           or "credentials"
  env:     the variable, with `file` empty for a secretKeyRef, or pointing at
           the mounted file otherwise
  file:    the file name under /etc/flotilla/secrets ("" for env references)
  who:     which pods need it: "all", "worker" or "database" (also the
           migration)
*/}}
{{- define "flotilla.secretRefs" -}}
{{- $v := .Values -}}
- {ref: {{ toJson $v.database.url }}, key: DATABASE_URL, store: database, env: DATABASE_URL, file: "", who: database}
- {ref: {{ toJson $v.database.tls.rootCert }}, key: postgres-ca.crt, store: database, env: PGSSLROOTCERT, file: postgres-ca.crt, who: database}
- {ref: {{ toJson $v.database.tls.clientCert }}, key: postgres-tls.crt, store: database, env: PGSSLCERT, file: postgres-tls.crt, who: database}
- {ref: {{ toJson $v.database.tls.clientKey }}, key: postgres-tls.key, store: database, env: PGSSLKEY, file: postgres-tls.key, who: database}
- {ref: {{ toJson $v.database.listenUrl }}, key: FLOTILLA_DB_LISTEN_URL, store: credentials, env: FLOTILLA_DB_LISTEN_URL, file: "", who: all}
- {ref: {{ toJson $v.kafka.sasl.password }}, key: kafka-sasl-password, store: credentials, env: KAFKA_SASL_PASSWORD_FILE, file: kafka-sasl-password, who: all}
- {ref: {{ toJson $v.kafka.tls.ca }}, key: kafka-ca.crt, store: credentials, env: KAFKA_SSL_CA_LOCATION, file: kafka-ca.crt, who: all}
- {ref: {{ toJson $v.kafka.tls.cert }}, key: kafka-tls.crt, store: credentials, env: KAFKA_SSL_CERTIFICATE_LOCATION, file: kafka-tls.crt, who: all}
- {ref: {{ toJson $v.kafka.tls.key }}, key: kafka-tls.key, store: credentials, env: KAFKA_SSL_KEY_LOCATION, file: kafka-tls.key, who: all}
- {ref: {{ toJson $v.kafka.tls.keyPassword }}, key: kafka-ssl-key-password, store: credentials, env: KAFKA_SSL_KEY_PASSWORD_FILE, file: kafka-ssl-key-password, who: all}
- {ref: {{ toJson $v.schemaRegistry.basicAuthUserInfo }}, key: schema-registry-user-info, store: credentials, env: SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO, file: "", who: all}
- {ref: {{ toJson $v.schemaRegistry.ca }}, key: schema-registry-ca.crt, store: credentials, env: SCHEMA_REGISTRY_SSL_CA_LOCATION, file: schema-registry-ca.crt, who: all}
- {ref: {{ toJson (include "flotilla.apiTokensRef" . | fromJson) }}, key: api-tokens, store: credentials, env: FLOTILLA_API_TOKENS, file: "", who: worker}
{{- end }}

{{/*
The API tokens reference: the values' one, marked set when the chart
generates a token.
*/}}
{{- define "flotilla.apiTokensRef" -}}
{{- $t := .Values.apiTokens -}}
{{- $ref := dict "value" $t.value "existingSecret" $t.existingSecret "existingSecretKey" $t.existingSecretKey -}}
{{- if and (not $t.value) (not $t.existingSecret) $t.generate -}}
{{- $_ := set $ref "generated" true -}}
{{- end -}}
{{- toJson $ref -}}
{{- end }}

{{/*
The secret references in use for a pod, resolved to a Secret name and key.
Call with (dict "root" $ "pod" "worker"|"relay"|"migration"); returns a YAML
list of {env, file, secret, key}.
*/}}
{{- define "flotilla.podSecrets" -}}
{{- $root := .root -}}
{{- $pod := .pod -}}
{{- $out := list -}}
{{- range (include "flotilla.secretRefs" $root | fromYamlArray) -}}
{{- $ref := .ref -}}
{{- $wanted := or (eq .who "all") (eq .who "database") (and (eq .who "worker") (eq $pod "worker")) -}}
{{- if and (eq $pod "migration") (ne .who "database") -}}
{{- $wanted = false -}}
{{- end -}}
{{- if and $wanted (or $ref.value $ref.existingSecret $ref.generated) -}}
{{- $secret := "" -}}
{{- $key := .key -}}
{{- if $ref.existingSecret -}}
{{- $secret = $ref.existingSecret -}}
{{- $key = $ref.existingSecretKey -}}
{{- else if eq .store "database" -}}
{{- $secret = ternary (include "flotilla.migrationSecret" $root) (include "flotilla.databaseSecret" $root) (eq $pod "migration") -}}
{{- else -}}
{{- $secret = include "flotilla.credentialsSecret" $root -}}
{{- end -}}
{{- $out = append $out (dict "env" .env "file" .file "secret" $secret "key" $key) -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/*
Values a chart-made Secret holds. Call with (dict "root" $ "store"
"database"|"credentials"); returns a JSON object key -> value (generated API
tokens excluded).
*/}}
{{- define "flotilla.secretData" -}}
{{- $store := .store -}}
{{- $data := dict -}}
{{- range (include "flotilla.secretRefs" .root | fromYamlArray) -}}
{{- if and (eq .store $store) .ref.value (not .ref.existingSecret) -}}
{{- $_ := set $data .key .ref.value -}}
{{- end -}}
{{- end -}}
{{- toJson $data -}}
{{- end }}

{{/*
A duration of the form <n>ms, <n>s or <n>m, in whole seconds (rounded up).
*/}}
{{- define "flotilla.seconds" -}}
{{- $d := toString . -}}
{{- if regexMatch "^[0-9]+ms$" $d -}}
{{- div (add (trimSuffix "ms" $d | atoi) 999) 1000 -}}
{{- else if regexMatch "^[0-9]+s$" $d -}}
{{- trimSuffix "s" $d | atoi -}}
{{- else if regexMatch "^[0-9]+m$" $d -}}
{{- mul (trimSuffix "m" $d | atoi) 60 -}}
{{- else -}}
{{- fail (printf "shutdownGrace %q: use <n>ms, <n>s or <n>m" $d) -}}
{{- end -}}
{{- end }}

{{/*
Refuses a termination grace period that does not cover the preStop pause,
the drain and what follows it ("windDown" seconds: the worker hands back
the jobs still running and leaves the fleet, up to half its lease plus
1 s). Call with (dict "name" "worker" "v" .Values.worker "windDown" 15).
*/}}
{{- define "flotilla.checkGrace" -}}
{{- $need := add .v.preStopSleepSeconds (include "flotilla.seconds" .v.shutdownGrace | atoi) (.windDown | default 0) -}}
{{- if le (int .v.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + shutdownGrace + the wind-down after it (%d s)" .name (int .v.terminationGracePeriodSeconds) (int $need)) -}}
{{- end -}}
{{- end }}

{{/*
Environment shared by the worker, the relay and (database part only) the
migration. Call with (dict "root" $ "pod" ...).
*/}}
{{- define "flotilla.env" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- range (include "flotilla.podSecrets" . | fromYamlArray) }}
{{- if .file }}
- name: {{ .env }}
  value: {{ printf "/etc/flotilla/secrets/%s" .file | quote }}
{{- else }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- with $v.database.sslMode }}
- name: PGSSLMODE
  value: {{ . | quote }}
{{- end }}
- name: FLOTILLA_DB_POOLER
  value: {{ $v.database.pooler | quote }}
- name: RUST_LOG
  value: {{ $v.logging.filter | quote }}
- name: FLOTILLA_LOG_JSON
  value: {{ $v.logging.json | quote }}
{{- if ne .pod "migration" }}
- name: FLOTILLA_DB_MAX_CONNECTIONS
  value: {{ int $v.database.maxConnections | quote }}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ $v.kafka.bootstrapServers | quote }}
{{- with $v.kafka.securityProtocol }}
- name: KAFKA_SECURITY_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with $v.kafka.sasl.mechanism }}
- name: KAFKA_SASL_MECHANISM
  value: {{ . | quote }}
{{- end }}
{{- with $v.kafka.sasl.username }}
- name: KAFKA_SASL_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if $v.kafkaProperties }}
- name: FLOTILLA_KAFKA_PROPERTIES_FILE
  value: /etc/flotilla/kafka/kafka.properties
{{- end }}
{{- with $v.schemaRegistry.url }}
- name: SCHEMA_REGISTRY_URL
  value: {{ . | quote }}
{{- end }}
- name: FLOTILLA_REQUEST_TOPIC
  value: {{ $v.topics.requests | quote }}
- name: FLOTILLA_EVENT_TOPIC
  value: {{ $v.topics.events | quote }}
- name: FLOTILLA_CREATE_TOPICS
  value: {{ $v.topics.create | quote }}
- name: FLOTILLA_TOPIC_PARTITIONS
  value: {{ int $v.topics.partitions | quote }}
- name: FLOTILLA_TOPIC_REPLICATION
  value: {{ toString $v.topics.replication | quote }}
- name: FLOTILLA_TOPIC_MIN_INSYNC_REPLICAS
  value: {{ toString $v.topics.minInsyncReplicas | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Volumes for the mounted secrets and the Kafka properties, plus /tmp (the
root file system is read-only). Call with (dict "root" $ "pod" ...).
*/}}
{{- define "flotilla.volumes" -}}
{{- $files := list -}}
{{- range (include "flotilla.podSecrets" . | fromYamlArray) }}
{{- if .file }}
{{- $files = append $files . }}
{{- end }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $files }}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
{{- range $files }}
      - secret:
          name: {{ .secret }}
          items:
            - key: {{ .key }}
              path: {{ .file }}
{{- end }}
{{- end }}
{{- if and .root.Values.kafkaProperties (ne .pod "migration") }}
- name: kafka-properties
  secret:
    secretName: {{ include "flotilla.kafkaPropertiesSecret" .root }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "flotilla.volumeMounts" -}}
{{- $files := list -}}
{{- range (include "flotilla.podSecrets" . | fromYamlArray) }}
{{- if .file }}
{{- $files = append $files . }}
{{- end }}
{{- end }}
- name: tmp
  mountPath: /tmp
{{- if $files }}
- name: secrets
  mountPath: /etc/flotilla/secrets
  readOnly: true
{{- end }}
{{- if and .root.Values.kafkaProperties (ne .pod "migration") }}
- name: kafka-properties
  mountPath: /etc/flotilla/kafka
  readOnly: true
{{- end }}
{{- end }}

{{/*
A checksum of what the pods read from chart-made ConfigMaps and Secrets, so
pods roll when it changes (workers register workflows only at start-up).
Generated tokens are left out: they never change once made.
*/}}
{{- define "flotilla.configChecksum" -}}
{{- $v := .Values -}}
{{- list $v.workflows $v.targets $v.demoTarget $v.kafkaProperties (include "flotilla.secretRefs" . ) | toJson | sha256sum -}}
{{- end }}
