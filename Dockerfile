# One image for every kbroker service; the command picks the service:
#   docker run kbroker python -m services.log --node-id 0 --data-dir /var/lib/kbroker/log
#   docker run kbroker kbroker up            (a whole cluster in one container, for trying out)
# Kubernetes runs it from deploy/k8s (non-root uid 10001, read-only root filesystem).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/kbroker
COPY pyproject.toml README.md ./
COPY services ./services
COPY proto ./proto
RUN /opt/kbroker/bin/pip install . \
 && /opt/kbroker/bin/pip install grpcio-tools==1.85.1 \
 && mkdir -p /opt/kbroker/proto \
 && /opt/kbroker/bin/python -m grpc_tools.protoc -I proto --python_out=/opt/kbroker/proto \
        --pyi_out=/opt/kbroker/proto --grpc_python_out=/opt/kbroker/proto \
        $(find proto/kbroker -name '*.proto') \
 && find /opt/kbroker/proto/kbroker -type d -exec touch {}/__init__.py \; \
 && echo /opt/kbroker/proto > "$(/opt/kbroker/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kbroker-proto.pth" \
 && /opt/kbroker/bin/pip uninstall -y grpcio-tools \
 && /opt/kbroker/bin/python -m compileall -q /opt/kbroker

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/kbroker /opt/kbroker
RUN groupadd --system --gid 10001 kbroker \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/kbroker --create-home kbroker
ENV PATH=/opt/kbroker/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/kbroker
USER 10001:10001
# Kafka (frontend), gRPC of each service, Prometheus.
EXPOSE 9092 19090 19100 19200 19300 19400 9464
CMD ["python", "-m", "services.frontend", "--help"]
