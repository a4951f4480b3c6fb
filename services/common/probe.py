"""``python -m services.common.probe HOST:PORT [--service NAME]``: one gRPC health check, for
Kubernetes exec probes of ports that require client certificates (a plain ``grpc`` probe cannot
present one).

TLS material comes from the same settings as the services': ``--internal-tls-ca``,
``--internal-tls-cert``, ``--internal-tls-key`` or ``KBROKER_INTERNAL_TLS_*`` (none: plaintext,
to a loopback address only). The server's certificate must name ``--server-name``; by default
the probe's own certificate's CN, since an exec probe runs in the pod it checks, with that
pod's certificate. Exit status 0 when the service answers SERVING, 1 otherwise (another
status, an error, no answer within ``--timeout`` seconds), 2 for unusable settings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .channels import internal_sync_channel
from .config import load, option
from .tls import CA_HELP, CERT_HELP, KEY_HELP, InternalTls, InternalTlsError


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """One gRPC health check."""

    service: str = option("", "health service name to check (empty: the whole server)")
    timeout: float = option(5.0, "seconds to wait for the answer")
    server_name: str = option("", "name the server's certificate must match (default: the "
                                  "CN of internal_tls_cert)")
    internal_tls_ca: str = option("", CA_HELP)
    internal_tls_cert: str = option("", CERT_HELP)
    internal_tls_key: str = option("", KEY_HELP)


def check(target: str, config: ProbeConfig) -> tuple[bool, str]:
    """(serving, what to print) for one health check of ``target``."""
    tls = InternalTls.of(config)
    server_name = config.server_name
    if tls.enabled and not server_name:
        try:
            server_name = tls.common_name() or ""
        except (OSError, ValueError) as e:
            raise InternalTlsError(f"cannot read the CN of {tls.cert}: {e}") from e
        if not server_name:
            raise InternalTlsError(f"{tls.cert} has no CN: give --server-name")
    with internal_sync_channel(target, tls, "service", server_name=server_name) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=config.service), timeout=config.timeout)
        except grpc.RpcError as e:
            return False, f"{target}: {e.code().name}: {e.details()}"  # type: ignore[attr-defined]
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{target}: {status}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.probe",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="HOST:PORT of the gRPC port")
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        serving, said = check(args.target, load(ProbeConfig, rest))
    except InternalTlsError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    print(said, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    raise SystemExit(main())
