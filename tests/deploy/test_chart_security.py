"""The chart's security wiring, offline: Kafka listeners by security protocol, the listeners'
TLS certificate (existing Secret or cert-manager Certificate), SASL users and keys, the
authorizer and the ACLs created with the cluster, internal mutual TLS (certificates generated
by Helm and kept across upgrades, existing Secrets, cert-manager) mounted into every pod with
the KBROKER_INTERNAL_TLS_* settings, and probes that still reach TLS ports."""

from __future__ import annotations

import base64
import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.acls import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    invalid_binding_reason,
)

from .conftest import (
    CHART,
    SCENARIOS,
    RenderError,
    find,
    one,
    probe_check,
    render,
    validate_strictly,
)

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
SECURE_CERT_MANAGER = CHART / "ci" / "05-secure-cert-manager-values.yaml"
SECURE_SECRETS = CHART / "ci" / "06-secure-secrets-values.yaml"
SINGLE = SCENARIOS[0]
TLS_VARS = {"KBROKER_INTERNAL_TLS_CA": "ca.crt", "KBROKER_INTERNAL_TLS_CERT": "tls.crt",
            "KBROKER_INTERNAL_TLS_KEY": "tls.key"}


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]


def role_of(workload: dict[str, Any]) -> str:
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every service container."""
    return [(w["spec"]["template"]["spec"], c) for w in workloads(docs)
            for c in w["spec"]["template"]["spec"]["containers"]]


def environment(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The KBROKER_* variables a container gets from its ConfigMaps and its own env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    env.update({v["name"]: v["value"] for v in container.get("env", []) if "value" in v})
    return {k: v for k, v in env.items() if k.startswith("KBROKER_")}


def mounted(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume a file path of the container lies in (and the key inside it)."""
    for mount in container["volumeMounts"]:
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            return {**volume, "key": path[len(mount["mountPath"]) + 1:],
                    "readOnly": mount.get("readOnly", False)}
    raise AssertionError(f"{container['name']}: {path} is in no mounted volume")


def _args(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"])


def secret_data(docs: list[dict[str, Any]], name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in one(docs, "Secret", name)["data"].items()}


def certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


# --- security off ----------------------------------------------------------------------------


def test_with_client_security_off_only_the_internal_certificates_are_rendered() -> None:
    docs = render(SINGLE)
    for doc in docs:
        validate_strictly(doc)
    assert not find(docs, "Certificate")
    assert all(d["metadata"]["name"].endswith(("internal-tls", "internal-ca"))
               for d in find(docs, "Secret"))
    for _pod, c in containers(docs):
        assert not any(k.startswith(("KBROKER_SSL", "KBROKER_SASL"))
                       for k in environment(docs, c)), c["name"]
    frontend = one(docs, "StatefulSet", "kb-kbroker-frontend")["spec"]["template"]["spec"]
    assert _args(frontend["containers"][0])["listeners"] == "PLAINTEXT://0.0.0.0:9092"
    assert "KBROKER_AUTHORIZER_ENABLED" not in one(docs, "ConfigMap", "kb-kbroker-handler")["data"]
    assert not find(docs, "ConfigMap", "kb-kbroker-acls")


def test_internal_tls_cannot_be_turned_off() -> None:
    # The services refuse plaintext gRPC on pod addresses: the chart says so at once.
    with pytest.raises(RenderError, match="internalTls.enabled=false"):
        render(SINGLE, sets=("internalTls.enabled=false",))


# --- internal mutual TLS ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [SINGLE, SECURE_CERT_MANAGER, SECURE_SECRETS],
                         ids=["helm", "cert-manager", "helm-with-client-security"])
def test_every_pod_mounts_its_roles_certificate_and_names_it_in_its_config(values: Path) -> None:
    docs = render(values)
    issued = {d["spec"]["secretName"]: d for d in find(docs, "Certificate")}
    generated = {d["metadata"]["name"] for d in find(docs, "Secret")}
    for workload in workloads(docs):
        role = role_of(workload)
        for c in workload["spec"]["template"]["spec"]["containers"]:
            env = environment(docs, c)
            volumes = {mounted(workload["spec"]["template"]["spec"], c, env[var])["secret"][
                "secretName"] for var in TLS_VARS}
            (secret,) = volumes
            assert secret == f"kb-kbroker-{role}-internal-tls"
            for var, key in TLS_VARS.items():
                volume = mounted(workload["spec"]["template"]["spec"], c, env[var])
                assert volume["key"] == key and volume["readOnly"] is True
                # Private keys readable by the pod's group only.
                assert volume["secret"]["defaultMode"] == 0o440
            if issued:
                assert issued[secret]["spec"]["commonName"] == f"kbroker-{role}"
            else:
                assert secret in generated


def test_probes_run_the_probe_module_on_the_grpc_port_while_it_speaks_tls() -> None:
    docs = render(SINGLE)
    for _, c in containers(docs):
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"].startswith("grpc"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in c[probe], f"{c['name']} {probe}"
            assert probe_check(c[probe])[0] == grpc_port
            # A Python process per check: more time than a built-in probe.
            assert c[probe]["timeoutSeconds"] == 5
        # The probe module reads the same KBROKER_INTERNAL_TLS_* as the service.
        assert TLS_VARS.keys() <= environment(docs, c).keys()
    replicator = one(docs, "Deployment", "kb-kbroker-replicator")["spec"]["template"]["spec"][
        "containers"][0]
    assert replicator["readinessProbe"]["exec"]["command"][-1] == (
        "--service=kbroker.replicator.v1.Replicator")


def test_probe_module_accepts_the_rendered_command() -> None:
    """The probe module parses what the chart runs (a failed check, not a usage error)."""
    import subprocess
    import sys

    from .conftest import ROOT

    docs = render(SINGLE)
    replicator = one(docs, "Deployment", "kb-kbroker-replicator")["spec"]["template"]["spec"][
        "containers"][0]
    command = replicator["readinessProbe"]["exec"]["command"]
    port = probe_check(replicator["readinessProbe"])[0]
    # Nothing listens there in the test: plaintext to loopback, refused, exit status 1.
    result = subprocess.run([sys.executable, *command[1:3], f"127.0.0.1:{port}", *command[4:],
                             "--timeout=1"], capture_output=True, text=True, timeout=30,
                            cwd=ROOT, env={"PATH": "/usr/bin:/bin"})
    # Exit status 1 and the target in the complaint: a check that ran and failed (a missing
    # module or a refused option would say otherwise).
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}: UNAVAILABLE" in result.stderr, result.stderr


def _generated(docs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {d["metadata"]["name"]: secret_data(docs, d["metadata"]["name"])
            for d in find(docs, "Secret")}


def test_generated_certificates_name_each_role_and_are_signed_by_one_ca() -> None:
    docs = render(SCENARIOS[1])
    secrets = _generated(docs)
    ca = certificate(secrets["kb-kbroker-internal-ca"]["tls.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert set(secrets) == {"kb-kbroker-internal-ca",
                            *(f"kb-kbroker-{r}-internal-tls" for r in ROLES)}
    for role in ROLES:
        data = secrets[f"kb-kbroker-{role}-internal-tls"]
        secret = one(docs, "Secret", f"kb-kbroker-{role}-internal-tls")
        assert secret["type"] == "kubernetes.io/tls"
        assert data["ca.crt"] == secrets["kb-kbroker-internal-ca"]["tls.crt"]
        cert = certificate(data["tls.crt"])
        cert.verify_directly_issued_by(ca)
        cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        assert cn == f"kbroker-{role}"
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
        # Peers check the kind's identity (gRPC matches SANs when there are any).
        assert cn in names
        # Every DNS name the chart dials this role at is covered.
        dialled = [f"kb-kbroker-{role}.kbroker.svc.cluster.local",
                   f"kb-kbroker-{role}-0.kb-kbroker-{role}-headless.kbroker.svc.cluster.local",
                   f"kb-kbroker-{role}-headless.kbroker.svc.cluster.local"]
        for host in dialled:
            assert any(fnmatch.fnmatch(host, n) and host.count(".") == n.count(".")
                       for n in names), (role, host)
        assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
        key = serialization.load_pem_private_key(data["tls.key"], password=None)
        assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def _existing(secrets: dict[str, dict[str, bytes]], *names: str) -> str:
    """A values file making ``names`` look installed, as helm's lookup would find them."""
    existing = {n: {k: base64.b64encode(v).decode() for k, v in secrets[n].items()}
                for n in names}
    return yaml.safe_dump({"internalTls": {"helm": {"existing": existing}}})


def _checksums(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["annotations"][
        "checksum/internal-tls"] for w in workloads(docs)}


def test_an_upgrade_keeps_installed_certificates_and_the_pods(tmp_path: Path) -> None:
    first = render(SINGLE)
    installed = _generated(first)
    # Without anything installed, every rendering makes new ones.
    again = _generated(render(SINGLE, release="kb", sets=("logLevel=DEBUG",)))
    assert again["kb-kbroker-internal-ca"] != installed["kb-kbroker-internal-ca"]
    # With them installed, the upgrade renders the same Secrets and leaves the pods alone.
    everything = tmp_path / "installed.yaml"
    everything.write_text(_existing(installed, *installed))
    upgraded = render(SINGLE, everything)
    assert _generated(upgraded) == installed
    assert _checksums(upgraded) == _checksums(first)


def test_a_missing_role_certificate_is_signed_by_the_installed_ca(tmp_path: Path) -> None:
    first = render(SINGLE)
    installed = _generated(first)
    kept = [n for n in installed if n != "kb-kbroker-log-internal-tls"]
    values = tmp_path / "installed.yaml"
    values.write_text(_existing(installed, *kept))
    docs = render(SINGLE, values)
    upgraded = _generated(docs)
    for name in kept:
        assert upgraded[name] == installed[name], name
    log = upgraded["kb-kbroker-log-internal-tls"]
    assert log != installed["kb-kbroker-log-internal-tls"]
    ca = certificate(installed["kb-kbroker-internal-ca"]["tls.crt"])
    certificate(log["tls.crt"]).verify_directly_issued_by(ca)
    assert log["ca.crt"] == installed["kb-kbroker-internal-ca"]["tls.crt"]
    # Only the log nodes roll.
    before, after = _checksums(first), _checksums(docs)
    assert {name for name in before if before[name] != after[name]} == {"kb-kbroker-log"}


def test_role_certificates_of_another_ca_are_replaced(tmp_path: Path) -> None:
    old = _generated(render(SINGLE))
    new_ca = _generated(render(SINGLE, sets=("logLevel=WARNING",)))
    # The CA Secret was deleted (rotation) and a new one is in place: roles signed by the old
    # CA would not be trusted by pods that trust the new one, so they are all re-signed.
    mixed = {**old, "kb-kbroker-internal-ca": new_ca["kb-kbroker-internal-ca"]}
    values = tmp_path / "rotated.yaml"
    values.write_text(_existing(mixed, *mixed))
    rotated = _generated(render(SINGLE, values))
    ca = certificate(new_ca["kb-kbroker-internal-ca"]["tls.crt"])
    for role in ROLES:
        data = rotated[f"kb-kbroker-{role}-internal-tls"]
        assert data != old[f"kb-kbroker-{role}-internal-tls"]
        certificate(data["tls.crt"]).verify_directly_issued_by(ca)


def test_existing_secrets_are_mounted_and_none_is_rendered() -> None:
    docs = render(SINGLE, sets=("internalTls.certificates=existingSecrets",
                                "internalTls.existingSecrets.log=my-log-cert"))
    assert not find(docs, "Secret") and not find(docs, "Certificate")
    for workload in workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "internal-tls"]
        role = role_of(workload)
        expected = "my-log-cert" if role == "log" else f"kb-kbroker-{role}-internal-tls"
        assert volume["secret"]["secretName"] == expected
        assert "checksum/internal-tls" not in workload["spec"]["template"]["metadata"][
            "annotations"]


def test_internal_certificates_from_cert_manager() -> None:
    docs = render(SECURE_CERT_MANAGER)
    assert not find(docs, "Secret")
    certs = {c["metadata"]["name"]: c for c in find(docs, "Certificate")}
    for role in ROLES:
        spec = certs[f"kb-kbroker-{role}-internal-tls"]["spec"]
        assert spec["secretName"] == f"kb-kbroker-{role}-internal-tls"
        assert spec["commonName"] == spec["dnsNames"][0] == f"kbroker-{role}"
        assert {"server auth", "client auth"} <= set(spec["usages"])
        assert spec["issuerRef"] == {"name": "kbroker-internal-ca", "kind": "Issuer",
                                     "group": "cert-manager.io"}
        assert spec["ipAddresses"] == ["127.0.0.1", "::1"]
    handler = one(docs, "ConfigMap", "kb-kbroker-handler")["data"]
    assert handler["KBROKER_FRONTEND_IDENTITIES"] == "kbroker-frontend"


# --- client-facing listeners ----------------------------------------------------------------


def test_listeners_bind_advertise_and_expose_each_protocol() -> None:
    docs = render(SECURE_CERT_MANAGER)
    sts = one(docs, "StatefulSet", "kb-kbroker-frontend")
    pod = sts["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    internal, external = _args(by_name["kafka"]), _args(by_name["kafka-external"])
    pod_dns = "$(POD_NAME).kb-kbroker-frontend-headless.$(POD_NAMESPACE).svc.cluster.local"
    assert internal["listeners"] == "SASL_SSL://0.0.0.0:9092,SSL://0.0.0.0:9292"
    assert internal["advertised-listeners"] == f"SASL_SSL://{pod_dns}:9092,SSL://{pod_dns}:9292"
    assert external["listeners"] == "SASL_SSL://0.0.0.0:9192"
    assert external["advertised-listeners"] == "SASL_SSL://$(POD_NAME).kafka.example.com:9094"
    # Broker N on each listener's port + N, named by protocol.
    ports = {p["name"]: p["containerPort"] for p in by_name["kafka"]["ports"]}
    assert [ports[f"sasl-ssl-{n}"] for n in range(3)] == [9092, 9093, 9094]
    assert [ports[f"ssl-{n}"] for n in range(3)] == [9292, 9293, 9294]
    bootstrap = one(docs, "Service", "kb-kbroker-frontend")
    assert [(p["name"], p["port"], p["targetPort"]) for p in bootstrap["spec"]["ports"]] == [
        ("sasl-ssl", 9092, "sasl-ssl-0"), ("ssl", 9292, "ssl-0")]
    headless = one(docs, "Service", "kb-kbroker-frontend-headless")
    assert {p["targetPort"] for p in headless["spec"]["ports"]} - {"grpc"} == {
        *(f"sasl-ssl-{n}" for n in range(3)), *(f"ssl-{n}" for n in range(3))}
    # Clients reach every listener port through the NetworkPolicy.
    policy = one(docs, "NetworkPolicy", "kb-kbroker-frontend")
    kafka_ports = {p["port"] for p in policy["spec"]["ingress"][0]["ports"]}
    assert kafka_ports == {9092, 9093, 9094, 9292, 9293, 9294, 9192, 9193, 9194}
    # The frontends follow the cluster metadata (SCRAM credentials) from the replicator.
    for c in by_name.values():
        host, port = _args(c)["replicator-address"].rsplit(":", 1)
        assert host.split(".")[0] == "kb-kbroker-replicator" and port == "19400"
    replicator_policy = one(docs, "NetworkPolicy", "kb-kbroker-replicator")
    callers = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in replicator_policy["spec"]["ingress"] for p in rule.get("from", [])
               if "podSelector" in p}
    # ... as the handlers do, and the log nodes asking for their controlled shutdown.
    assert callers == {"handler", "frontend", "log"}


def test_listener_certificate_from_cert_manager_names_every_advertised_address() -> None:
    docs = render(SECURE_CERT_MANAGER)
    (cert,) = [c for c in find(docs, "Certificate") if c["metadata"]["name"] ==
               "kb-kbroker-frontend-kafka-tls"]
    spec = cert["spec"]
    assert spec["issuerRef"] == {"name": "kafka-ca", "kind": "ClusterIssuer",
                                 "group": "cert-manager.io"}
    assert spec["usages"] == ["digital signature", "key encipherment", "server auth"]
    names = spec["dnsNames"]
    wanted = ["kb-kbroker-frontend.kbroker.svc.cluster.local",
              "kb-kbroker-frontend-1.kb-kbroker-frontend-headless.kbroker.svc.cluster.local",
              "kb-kbroker-frontend-0.kafka.example.com", "kb-kbroker-frontend-1.kafka.example.com"]
    for host in wanted:
        assert any(fnmatch.fnmatch(host, n) and host.count(".") == n.count(".") for n in names)
    pod = one(docs, "StatefulSet", "kb-kbroker-frontend")["spec"]["template"]["spec"]
    for c in pod["containers"]:
        env = environment(docs, c)
        for var in ("KBROKER_SSL_CERTFILE", "KBROKER_SSL_KEYFILE", "KBROKER_SSL_CAFILE"):
            volume = mounted(pod, c, env[var])
            assert volume["secret"]["secretName"] == spec["secretName"]
        assert env["KBROKER_SSL_CLIENT_AUTH"] == "requested"
        assert env["KBROKER_SSL_PRINCIPAL_MAPPING_RULES"] == "RULE:^CN=([^,]+).*$/$1/,DEFAULT"


def test_existing_listener_secret_and_a_separate_client_ca() -> None:
    docs = render(SECURE_SECRETS)
    assert not find(docs, "Certificate")
    pod = one(docs, "StatefulSet", "kb-kbroker-frontend")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = environment(docs, c)
    assert _args(c)["listeners"] == "SSL://0.0.0.0:9093,SASL_PLAINTEXT://0.0.0.0:9095"
    assert mounted(pod, c, env["KBROKER_SSL_CERTFILE"])["secret"]["secretName"] == (
        "kafka-listener-tls")
    ca = mounted(pod, c, env["KBROKER_SSL_CAFILE"])
    assert (ca["secret"]["secretName"], ca["key"]) == ("kafka-client-ca", "ca.crt")
    assert env["KBROKER_SSL_CLIENT_AUTH"] == "required"
    jwks = mounted(pod, c, env["KBROKER_SASL_OAUTHBEARER_JWKS"])
    assert (jwks["configMap"]["name"], jwks["key"]) == ("issuer-jwks", "jwks.json")
    assert env["KBROKER_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-256,OAUTHBEARER"
    assert "KBROKER_SASL_USERS_FILE" not in env


def test_sasl_settings_and_the_users_file_from_a_secret() -> None:
    docs = render(SECURE_CERT_MANAGER)
    pod = one(docs, "StatefulSet", "kb-kbroker-frontend")["spec"]["template"]["spec"]
    for c in pod["containers"]:
        env = environment(docs, c)
        users = mounted(pod, c, env["KBROKER_SASL_USERS_FILE"])
        assert (users["secret"]["secretName"], users["key"]) == ("kafka-users", "users")
        assert users["readOnly"] is True
        assert env["KBROKER_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512,PLAIN,OAUTHBEARER"
        assert env["KBROKER_SASL_OAUTHBEARER_JWKS"] == (
            "https://login.example.com/.well-known/jwks.json")
        assert env["KBROKER_SASL_OAUTHBEARER_EXPECTED_ISSUER"] == "https://login.example.com/"
        assert env["KBROKER_SASL_OAUTHBEARER_EXPECTED_AUDIENCE"] == "kafka"
        assert env["KBROKER_CONNECTIONS_MAX_REAUTH_MS"] == "3600000"
        assert "KBROKER_SASL_OAUTHBEARER_ALLOW_UNSECURED" not in env


def test_every_file_a_service_is_given_is_mounted(scenario: Path) -> None:
    docs = render(scenario)
    for pod, c in containers(docs):
        for value in environment(docs, c).values():
            if value.startswith("/etc/kbroker/"):
                mounted(pod, c, value)
        mounts = [m["mountPath"] for m in c["volumeMounts"]]
        assert len(mounts) == len(set(mounts))


# --- authorization ---------------------------------------------------------------------------


def test_authorizer_settings_reach_the_handlers() -> None:
    handler = one(render(SECURE_CERT_MANAGER), "ConfigMap", "kb-kbroker-handler")["data"]
    assert handler["KBROKER_AUTHORIZER_ENABLED"] == "true"
    assert handler["KBROKER_SUPER_USERS"] == "User:admin;User:ops-client"
    assert handler["KBROKER_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    other = one(render(SECURE_SECRETS), "ConfigMap", "kb-kbroker-handler")["data"]
    assert other["KBROKER_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "true"


def test_initial_acls_are_a_json_file_the_replicator_reads() -> None:
    docs = render(SECURE_CERT_MANAGER)
    deployment = one(docs, "Deployment", "kb-kbroker-replicator")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    path = environment(docs, c)["KBROKER_INITIAL_ACLS_FILE"]
    volume = mounted(pod, c, path)
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    acls = json.loads(config_map["data"][volume["key"]])
    bindings = [AclBinding(ResourceType[a["resource_type"]], a["resource_name"],
                           PatternType[a["pattern_type"]], a["principal"], a["host"],
                           Operation[a["operation"]], Permission[a["permission"]])
                for a in acls]
    assert all(invalid_binding_reason(b) is None for b in bindings)
    assert bindings[0] == AclBinding(ResourceType.TOPIC, "orders-", PatternType.PREFIXED,
                                     "User:alice", "*", Operation.WRITE, Permission.ALLOW)
    assert bindings[2].permission == Permission.DENY
    # A changed list rolls the replicator (it reads the file at start-up).
    assert "checksum/acls" in deployment["spec"]["template"]["metadata"]["annotations"]
    # Only the replicator reads it.
    for workload in workloads(docs):
        if role_of(workload) != "replicator":
            for c in workload["spec"]["template"]["spec"]["containers"]:
                assert "KBROKER_INITIAL_ACLS_FILE" not in environment(docs, c)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("sets", "message"), [
    (("frontend.listeners[0].protocol=SSL", "frontend.listeners[0].port=9093"),
     "needs a certificate"),
    (("frontend.listeners[0].protocol=SASL_PLAINTEXT", "frontend.listeners[0].port=9093",
      "frontend.sasl.enabledMechanisms={PLAIN}"), "SASL PLAIN needs its users"),
    (("frontend.listeners[0].protocol=SASL_PLAINTEXT", "frontend.listeners[0].port=9093",
      "frontend.sasl.enabledMechanisms={OAUTHBEARER}"), "needs the issuer's keys"),
    (("frontend.listeners[0].protocol=SSL", "frontend.listeners[0].port=9093",
      "frontend.tls.certManager.enabled=true"), "issuerRef.name is required"),
    (("frontend.listeners[0].protocol=SSL", "frontend.listeners[0].port=9093",
      "frontend.tls.existingSecret=x", "frontend.tls.certManager.enabled=true",
      "frontend.tls.certManager.issuerRef.name=y"), "not both"),
    (("frontend.listeners[0].protocol=PLAINTEXT", "frontend.listeners[0].port=9092",
      "frontend.listeners[1].protocol=PLAINTEXT", "frontend.listeners[1].port=9300"),
     "two listeners with protocol PLAINTEXT"),
    (("frontend.listeners[0].protocol=PLAINTEXT", "frontend.listeners[0].port=9092",
      "frontend.listeners[1].protocol=SSL", "frontend.listeners[1].port=9094",
      "frontend.tls.existingSecret=x"), "overlap"),
    (("frontend.listeners[0].protocol=TLS",), "must be one of"),
    (("frontend.tls.clientAuth=yes",), "must be one of"),
    (("frontend.sasl.enabledMechanisms={GSSAPI}",), "must be one of"),
    (("internalTls.certificates=certManager",), "internalTls.certManager.issuerRef.name"),
    (("internalTls.certificates=vault",), "must be one of"),
    (("authorizer.acls[0].resourceType=TOPIC", "authorizer.acls[0].resourceName=t",
      "authorizer.acls[0].principal=alice", "authorizer.acls[0].operation=READ"),
     "does not match pattern"),
    (("authorizer.acls[0].resourceType=TOPIC", "authorizer.acls[0].resourceName=t",
      "authorizer.acls[0].principal=User:a", "authorizer.acls[0].operation=READ_ALL"),
     "must be one of"),
])
def test_bad_security_values_are_refused_with_a_reason(sets: tuple[str, ...],
                                                        message: str) -> None:
    with pytest.raises(RenderError, match=message):
        render(sets=sets)


def test_strict_validation_of_certificates_catches_a_misplaced_field() -> None:
    import kubernetes_validate

    (cert,) = [c for c in find(render(SECURE_CERT_MANAGER), "Certificate")
               if c["metadata"]["name"] == "kb-kbroker-frontend-kafka-tls"]
    validate_strictly(cert)
    for broken in ({**cert["spec"], "dnsName": ["x"]},
                   {**cert["spec"], "issuerRef": {**cert["spec"]["issuerRef"], "nam": "x"}},
                   {**cert["spec"], "duration": 90}):
        with pytest.raises(kubernetes_validate.ValidationError):
            validate_strictly({**cert, "spec": broken})
