{{/*
Security wiring shared by the roles: the frontend's Kafka listeners (security protocol, ports,
advertised addresses), client-facing TLS and SASL material, the handlers' authorizer, the ACLs
the replicator bootstraps, and the internal mTLS certificate every service presents and checks.
Everything a service reads lands in its ConfigMap as KBROKER_* variables (kbroker.securityEnv);
files come from Secrets and ConfigMaps mounted under /etc/kbroker.
*/}}

{{/* Short name of a security protocol, used in port names (IANA service names, 15 chars). */}}
{{- define "kbroker.protocolPortName" -}}
{{- get (dict "PLAINTEXT" "kafka" "SSL" "ssl" "SASL_PLAINTEXT" "sasl" "SASL_SSL" "sasl-ssl") . -}}
{{- end -}}

{{/* Every Kafka listener of the frontend pods, as a YAML list of {protocol, port, container}:
the internal container's listeners, then the external one's. */}}
{{- define "kbroker.allListeners" -}}
{{- $fe := .Values.frontend -}}
{{- $out := list -}}
{{- range $fe.listeners -}}
{{- $out = append $out (dict "protocol" .protocol "port" .port "container" "kafka") -}}
{{- end -}}
{{- if $fe.external.enabled -}}
{{- $out = append $out (dict "protocol" $fe.external.protocol "port" $fe.external.containerPort "container" "kafka-external") -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* "true" when some listener uses a protocol among the arguments. Call with (list $ "SSL" ...). */}}
{{- define "kbroker.anyListener" -}}
{{- $ := index . 0 -}}
{{- $wanted := rest . -}}
{{- range (include "kbroker.allListeners" $ | fromYamlArray) -}}
{{- if has .protocol $wanted -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The services refuse plaintext gRPC anywhere but on loopback, and pods talk over their
own addresses: internal TLS cannot be turned off in a cluster. */}}
{{- define "kbroker.checkInternalTls" -}}
{{- if not .Values.internalTls.enabled -}}
{{- fail "internalTls.enabled=false: the services accept plaintext gRPC only on loopback addresses and would refuse to start on pod addresses; keep internal TLS on (certificates from Helm, your Secrets or cert-manager: internalTls.certificates)" -}}
{{- end -}}
{{- end -}}

{{/* Checks of the listener values that the schema cannot express. */}}
{{- define "kbroker.checkListeners" -}}
{{- $ := . -}}
{{- $brokers := int $.Values.log.replicas -}}
{{- $seen := dict -}}
{{- range $.Values.frontend.listeners -}}
{{- if hasKey $seen .protocol -}}
{{- fail (printf "frontend.listeners: two listeners with protocol %s (a listener is named by its security protocol)" .protocol) -}}
{{- end -}}
{{- $_ := set $seen .protocol true -}}
{{- end -}}
{{- $all := include "kbroker.allListeners" $ | fromYamlArray -}}
{{- range $i, $a := $all -}}
{{- range $j, $b := $all -}}
{{- if and (lt $i $j) (lt (int $a.port) (add $b.port $brokers)) (lt (int $b.port) (add $a.port $brokers)) -}}
{{- fail (printf "frontend listeners %s (ports %v-%v) and %s (ports %v-%v) overlap: each listener serves broker N on its port + N" $a.protocol $a.port (add $a.port $brokers -1) $b.protocol $b.port (add $b.port $brokers -1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $tls := $.Values.frontend.tls -}}
{{- if and (include "kbroker.anyListener" (list $ "SSL" "SASL_SSL")) (not $tls.existingSecret) (not $tls.certManager.enabled) -}}
{{- fail "an SSL or SASL_SSL listener needs a certificate: set frontend.tls.existingSecret or frontend.tls.certManager.enabled" -}}
{{- end -}}
{{- if and $tls.existingSecret $tls.certManager.enabled -}}
{{- fail "frontend.tls: set existingSecret or certManager.enabled, not both" -}}
{{- end -}}
{{- if and $tls.certManager.enabled (not $tls.certManager.issuerRef.name) -}}
{{- fail "frontend.tls.certManager.issuerRef.name is required with frontend.tls.certManager.enabled" -}}
{{- end -}}
{{- if include "kbroker.anyListener" (list $ "SASL_PLAINTEXT" "SASL_SSL") -}}
{{- $sasl := $.Values.frontend.sasl -}}
{{- if and (has "PLAIN" $sasl.enabledMechanisms) (not $sasl.users.existingSecret) -}}
{{- fail "SASL PLAIN needs its users: set frontend.sasl.users.existingSecret" -}}
{{- end -}}
{{- $jwt := $sasl.oauthbearer -}}
{{- if and (has "OAUTHBEARER" $sasl.enabledMechanisms) (not $jwt.jwksUrl) (not $jwt.jwksConfigMap) (not $jwt.allowUnsecured) -}}
{{- fail "SASL OAUTHBEARER needs the issuer's keys: set frontend.sasl.oauthbearer.jwksUrl or jwksConfigMap (or allowUnsecured, for tests only)" -}}
{{- end -}}
{{- if and $jwt.jwksUrl $jwt.jwksConfigMap -}}
{{- fail "frontend.sasl.oauthbearer: set jwksUrl or jwksConfigMap, not both" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Kafka-form listener lists of one frontend container, as {listeners, advertised}.
Call with (list $ "kafka") or (list $ "kafka-external"). */}}
{{- define "kbroker.listenerArgs" -}}
{{- $ := index . 0 -}}
{{- $container := index . 1 -}}
{{- $fe := $.Values.frontend -}}
{{- $name := include "kbroker.roleName" (list $ "frontend") -}}
{{- $bind := list -}}
{{- $advertised := list -}}
{{- if eq $container "kafka" -}}
{{- range $fe.listeners -}}
{{- $host := default (printf "$(POD_NAME).%s-headless.%s" $name (include "kbroker.dnsSuffix" $)) .advertisedHost -}}
{{- $bind = append $bind (printf "%s://%s:%v" .protocol $.Values.listenAddress .port) -}}
{{- $advertised = append $advertised (printf "%s://%s:%v" .protocol $host (default .port .advertisedPort)) -}}
{{- end -}}
{{- else -}}
{{- $ext := $fe.external -}}
{{- $host := ternary "$(HOST_IP)" (printf "$(POD_NAME).%s" $ext.domain) (eq $ext.type "HostPort") -}}
{{- $bind = append $bind (printf "%s://%s:%v" $ext.protocol $.Values.listenAddress $ext.containerPort) -}}
{{- $advertised = append $advertised (printf "%s://%s:%v" $ext.protocol $host $ext.advertisedPort) -}}
{{- end -}}
listeners: {{ join "," $bind | quote }}
advertised: {{ join "," $advertised | quote }}
{{- end -}}

{{/* Mount points. */}}
{{- define "kbroker.internalTlsDir" -}}/etc/kbroker/internal-tls{{- end -}}
{{- define "kbroker.kafkaTlsDir" -}}/etc/kbroker/kafka-tls{{- end -}}
{{- define "kbroker.kafkaClientCaDir" -}}/etc/kbroker/kafka-client-ca{{- end -}}
{{- define "kbroker.saslUsersDir" -}}/etc/kbroker/sasl-users{{- end -}}
{{- define "kbroker.jwksDir" -}}/etc/kbroker/oauthbearer-jwks{{- end -}}
{{- define "kbroker.aclsDir" -}}/etc/kbroker/acls{{- end -}}

{{/* Name of the Secret holding the frontends' client-facing certificate. */}}
{{- define "kbroker.kafkaTlsSecret" -}}
{{- default (printf "%s-kafka-tls" (include "kbroker.roleName" (list . "frontend"))) .Values.frontend.tls.existingSecret -}}
{{- end -}}

{{/* Name of the Secret holding a role's internal certificate (ca.crt, tls.crt, tls.key).
Call with (list $ "role"). */}}
{{- define "kbroker.internalTlsSecret" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- default (printf "%s-internal-tls" (include "kbroker.roleName" (list $ $role))) (index $.Values.internalTls.existingSecrets $role) -}}
{{- end -}}

{{/* Certificate subject of a role: its CN names the service kind. */}}
{{- define "kbroker.internalCommonName" -}}
{{- printf "kbroker-%s" . -}}
{{- end -}}

{{/* DNS SANs of a role's internal certificate. First its identity (kbroker-<role>): the
services and the probe check a peer's certificate against the identity of the kind they mean
to reach, whatever address they dial (gRPC's target name override), and gRPC matches SANs, not
the CN, when there are any. Then the names it is reached by, for tools such as grpcurl: its
Service, its headless Service and the pods behind it, in every form a resolver accepts, and
localhost. Call with (list $ "role"). */}}
{{- define "kbroker.internalDnsNames" -}}
{{- $ := index . 0 -}}
{{- $role := include "kbroker.roleName" . -}}
{{- $ns := $.Release.Namespace -}}
{{- $names := list (include "kbroker.internalCommonName" (index . 1)) "localhost" -}}
{{- range $svc := list $role (printf "%s-headless" $role) -}}
{{- $names = concat $names (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns $.Values.clusterDomain)) -}}
{{- end -}}
{{- $names = concat $names (list (printf "*.%s-headless.%s.svc" $role $ns) (printf "*.%s-headless.%s.svc.%s" $role $ns $.Values.clusterDomain)) -}}
{{- toYaml $names -}}
{{- end -}}

{{/* Loopback addresses the probes (and port-forwarded operators) reach a role at. */}}
{{- define "kbroker.internalIps" -}}
{{- toYaml (list "127.0.0.1" "::1") -}}
{{- end -}}

{{/* The KBROKER_* settings the security values give a role, as a YAML map (merged into the
role's ConfigMap). Call with (list $ "role"). */}}
{{- define "kbroker.securityEnv" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- $env := dict -}}
{{- if $.Values.internalTls.enabled -}}
{{- $dir := include "kbroker.internalTlsDir" $ -}}
{{- $_ := set $env "KBROKER_INTERNAL_TLS_CA" (printf "%s/ca.crt" $dir) -}}
{{- $_ := set $env "KBROKER_INTERNAL_TLS_CERT" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $env "KBROKER_INTERNAL_TLS_KEY" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- if eq $role "frontend" -}}
{{- $fe := $.Values.frontend -}}
{{- if include "kbroker.anyListener" (list $ "SSL" "SASL_SSL") -}}
{{- $dir := include "kbroker.kafkaTlsDir" $ -}}
{{- $_ := set $env "KBROKER_SSL_CERTFILE" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $env "KBROKER_SSL_KEYFILE" (printf "%s/tls.key" $dir) -}}
{{- $_ := set $env "KBROKER_SSL_CLIENT_AUTH" $fe.tls.clientAuth -}}
{{- if ne $fe.tls.clientAuth "none" -}}
{{- if $fe.tls.clientCaSecret -}}
{{- $_ := set $env "KBROKER_SSL_CAFILE" (printf "%s/ca.crt" (include "kbroker.kafkaClientCaDir" $)) -}}
{{- else -}}
{{- $_ := set $env "KBROKER_SSL_CAFILE" (printf "%s/ca.crt" $dir) -}}
{{- end -}}
{{- end -}}
{{- with $fe.tls.principalMappingRules -}}
{{- $_ := set $env "KBROKER_SSL_PRINCIPAL_MAPPING_RULES" . -}}
{{- end -}}
{{- end -}}
{{- if include "kbroker.anyListener" (list $ "SASL_PLAINTEXT" "SASL_SSL") -}}
{{- $sasl := $fe.sasl -}}
{{- $_ := set $env "KBROKER_SASL_ENABLED_MECHANISMS" (join "," $sasl.enabledMechanisms) -}}
{{- if $sasl.users.existingSecret -}}
{{- $_ := set $env "KBROKER_SASL_USERS_FILE" (printf "%s/%s" (include "kbroker.saslUsersDir" $) $sasl.users.key) -}}
{{- end -}}
{{- if has "OAUTHBEARER" $sasl.enabledMechanisms -}}
{{- $jwt := $sasl.oauthbearer -}}
{{- if $jwt.jwksUrl -}}
{{- $_ := set $env "KBROKER_SASL_OAUTHBEARER_JWKS" $jwt.jwksUrl -}}
{{- else if $jwt.jwksConfigMap -}}
{{- $_ := set $env "KBROKER_SASL_OAUTHBEARER_JWKS" (printf "%s/%s" (include "kbroker.jwksDir" $) $jwt.jwksKey) -}}
{{- end -}}
{{- with $jwt.expectedIssuer -}}
{{- $_ := set $env "KBROKER_SASL_OAUTHBEARER_EXPECTED_ISSUER" . -}}
{{- end -}}
{{- with $jwt.expectedAudience -}}
{{- $_ := set $env "KBROKER_SASL_OAUTHBEARER_EXPECTED_AUDIENCE" . -}}
{{- end -}}
{{- if $jwt.allowUnsecured -}}
{{- $_ := set $env "KBROKER_SASL_OAUTHBEARER_ALLOW_UNSECURED" "true" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $env "KBROKER_CONNECTIONS_MAX_REAUTH_MS" (include "kbroker.configValue" $sasl.connectionsMaxReauthMs) -}}
{{- end -}}
{{- end -}}
{{- if eq $role "handler" -}}
{{- $authz := $.Values.authorizer -}}
{{- if $authz.enabled -}}
{{- $_ := set $env "KBROKER_AUTHORIZER_ENABLED" "true" -}}
{{- $_ := set $env "KBROKER_SUPER_USERS" (join ";" $authz.superUsers) -}}
{{- $_ := set $env "KBROKER_ALLOW_EVERYONE_IF_NO_ACL_FOUND" (toString $authz.allowEveryoneIfNoAclFound) -}}
{{- end -}}
{{- if $.Values.internalTls.enabled -}}
{{- $_ := set $env "KBROKER_FRONTEND_IDENTITIES" (join "," $.Values.internalTls.frontendIdentities) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $role "replicator") $.Values.authorizer.acls -}}
{{- $_ := set $env "KBROKER_INITIAL_ACLS_FILE" (printf "%s/acls.json" (include "kbroker.aclsDir" $)) -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/* The initial ACLs as the replicator's JSON file: one object per binding, Kafka's names for
the codes, defaults filled in. */}}
{{- define "kbroker.aclsJson" -}}
{{- $out := list -}}
{{- range .Values.authorizer.acls -}}
{{- $out = append $out (dict
      "resource_type" .resourceType
      "resource_name" .resourceName
      "pattern_type" (default "LITERAL" .patternType)
      "principal" .principal
      "host" (default "*" .host)
      "operation" .operation
      "permission" (default "ALLOW" .permissionType)) -}}
{{- end -}}
{{- toPrettyJson $out -}}
{{- end -}}

{{/* Volumes for a role's security files. Call with (list $ "role"). */}}
{{- define "kbroker.securityVolumes" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- if $.Values.internalTls.enabled }}
- name: internal-tls
  secret:
    secretName: {{ include "kbroker.internalTlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- if eq $role "frontend" }}
{{- $fe := $.Values.frontend }}
{{- if include "kbroker.anyListener" (list $ "SSL" "SASL_SSL") }}
- name: kafka-tls
  secret:
    secretName: {{ include "kbroker.kafkaTlsSecret" $ }}
    defaultMode: 0440
{{- if and (ne $fe.tls.clientAuth "none") $fe.tls.clientCaSecret }}
- name: kafka-client-ca
  secret:
    secretName: {{ $fe.tls.clientCaSecret }}
    defaultMode: 0444
{{- end }}
{{- end }}
{{- if include "kbroker.anyListener" (list $ "SASL_PLAINTEXT" "SASL_SSL") }}
{{- if $fe.sasl.users.existingSecret }}
- name: sasl-users
  secret:
    secretName: {{ $fe.sasl.users.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if and (has "OAUTHBEARER" $fe.sasl.enabledMechanisms) $fe.sasl.oauthbearer.jwksConfigMap }}
- name: oauthbearer-jwks
  configMap:
    name: {{ $fe.sasl.oauthbearer.jwksConfigMap }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq $role "replicator") $.Values.authorizer.acls }}
- name: acls
  configMap:
    name: {{ include "kbroker.roleName" (list $ "acls") }}
{{- end }}
{{- end -}}

{{/* The matching volume mounts. Call with (list $ "role"). */}}
{{- define "kbroker.securityMounts" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- range $volume := (include "kbroker.securityVolumes" . | fromYamlArray) }}
- name: {{ $volume.name }}
  mountPath: {{ include (printf "kbroker.%sDir" (get (dict "internal-tls" "internalTls" "kafka-tls" "kafkaTls" "kafka-client-ca" "kafkaClientCa" "sasl-users" "saslUsers" "oauthbearer-jwks" "jwks" "acls" "acls") $volume.name)) $ }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod annotations that roll a role's pods when its certificate or mounted files change
(Secrets the chart generates; files from other Secrets are re-read by the services or roll
with their own checksums). Call with (list $ "role"). */}}
{{- define "kbroker.securityChecksums" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- if and $.Values.internalTls.enabled (eq $.Values.internalTls.certificates "helm") }}
checksum/internal-tls: {{ include "kbroker.internalTlsMaterial" $ | fromYaml | dig $role "tls.crt" "" | sha256sum }}
{{- end }}
{{- if and (eq $role "replicator") $.Values.authorizer.acls }}
checksum/acls: {{ include "kbroker.aclsJson" $ | sha256sum }}
{{- end }}
{{- end -}}

{{/* Internal certificates generated by Helm, as a YAML map: "ca" -> {tls.crt, tls.key} and
role -> {ca.crt, tls.crt, tls.key} (base64, as Secret data).

Upgrades keep what is installed: the CA Secret and each role's Secret are looked up first and
reused as they are (a role's when it was signed by the CA in use), so `helm upgrade` neither
regenerates certificates nor breaks the trust between running pods. Only what is missing is
generated: a new CA on the first install (or after its Secret was deleted), a role certificate
signed by the CA in use when its Secret is missing or was signed by another CA.
`internalTls.helm.existing` stands in for the lookups where there is no cluster to ask (helm
template), with the same shape as the Secrets: name -> data. Computed once per rendering. */}}
{{- define "kbroker.internalTlsMaterial" -}}
{{- $ := . -}}
{{- if not (hasKey $.Release "kbrokerInternalTls") -}}
{{- $days := int $.Values.internalTls.helm.validityDays -}}
{{- $existing := deepCopy (default dict $.Values.internalTls.helm.existing) -}}
{{- $caName := include "kbroker.roleName" (list $ "internal-ca") -}}
{{- $caData := dict -}}
{{- $found := lookup "v1" "Secret" $.Release.Namespace $caName -}}
{{- if $found -}}
{{- $caData = default dict $found.data -}}
{{- else if hasKey $existing $caName -}}
{{- $caData = index $existing $caName -}}
{{- end -}}
{{- $ca := dict -}}
{{- if and (index $caData "tls.crt") (index $caData "tls.key") -}}
{{- $ca = buildCustomCert (index $caData "tls.crt") (index $caData "tls.key") -}}
{{- else -}}
{{- $ca = genCA "kbroker-internal-ca" $days -}}
{{- $caData = dict "tls.crt" (b64enc $ca.Cert) "tls.key" (b64enc $ca.Key) -}}
{{- end -}}
{{- $material := dict "ca" (dict "tls.crt" (index $caData "tls.crt") "tls.key" (index $caData "tls.key")) -}}
{{- range $role := list "frontend" "handler" "log" "purgatory" "replicator" -}}
{{- $secretName := include "kbroker.internalTlsSecret" (list $ $role) -}}
{{- $data := dict -}}
{{- $found := lookup "v1" "Secret" $.Release.Namespace $secretName -}}
{{- if $found -}}
{{- $data = default dict $found.data -}}
{{- else if hasKey $existing $secretName -}}
{{- $data = index $existing $secretName -}}
{{- end -}}
{{- if not (and (eq (index $data "ca.crt" | default "") (index $caData "tls.crt")) (index $data "tls.crt") (index $data "tls.key")) -}}
{{- $cert := genSignedCert (include "kbroker.internalCommonName" $role) (include "kbroker.internalIps" $ | fromYamlArray) (include "kbroker.internalDnsNames" (list $ $role) | fromYamlArray) $days $ca -}}
{{- $data = dict "ca.crt" (index $caData "tls.crt") "tls.crt" (b64enc $cert.Cert) "tls.key" (b64enc $cert.Key) -}}
{{- end -}}
{{- $_ := set $material $role (dict "ca.crt" (index $data "ca.crt") "tls.crt" (index $data "tls.crt") "tls.key" (index $data "tls.key")) -}}
{{- end -}}
{{- $_ := set $.Release "kbrokerInternalTls" (toYaml $material) -}}
{{- end -}}
{{- get $.Release "kbrokerInternalTls" -}}
{{- end -}}

{{/* How a gRPC port's health is checked: Kubernetes' built-in gRPC probe while the port is
plaintext; with internal TLS (which the kubelet's probe does not speak) the probe module run
inside the container, presenting the pod's own certificate (KBROKER_INTERNAL_TLS_* from the
ConfigMap) and given more time (a Python process per check). Call with
(list $ port healthServiceName plaintextTimeoutSeconds); an empty name is the server's health. */}}
{{- define "kbroker.probeHandler" -}}
{{- $ := index . 0 -}}
{{- $port := index . 1 -}}
{{- $service := index . 2 -}}
{{- $timeout := index . 3 -}}
{{- if $.Values.internalTls.enabled -}}
{{- $host := ternary "[::1]" "127.0.0.1" (contains ":" $.Values.listenAddress) -}}
exec:
  command:
    - python
    - -m
    - services.common.probe
    - {{ printf "%s:%v" $host $port | quote }}
    {{- with $service }}
    - --service={{ . }}
    {{- end }}
timeoutSeconds: {{ $.Values.probes.execTimeoutSeconds }}
{{- else -}}
grpc:
  port: {{ $port }}
  {{- with $service }}
  service: {{ . }}
  {{- end }}
{{- with $timeout }}
timeoutSeconds: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}
