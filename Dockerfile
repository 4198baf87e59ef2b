# gpuslice: the kube-scheduler extender and admission webhook (`gpuslice serve`).
#
#   docker build -t <registry>/gpuslice:0.1.0 .
#
# Two stages. The builder installs the project into /opt/venv with scripts/install-venv.sh,
# the very command CI runs (`bash scripts/install-venv.sh .venv test`), so an install step
# that breaks fails CI before it breaks this build. The final stage is python:3.11-slim plus
# that venv: no compiler, no pip cache, no sources, no build tools.
# Runs as an unprivileged user with a read-only root filesystem: it writes nothing but
# /tmp (an emptyDir in manifests/deployment.yaml).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# README.md* : the readme pyproject.toml names, copied when present (a glob may match nothing).
COPY pyproject.toml README.md* ./
COPY scripts/install-venv.sh scripts/install-venv.sh
COPY scheduler ./scheduler
RUN bash scripts/install-venv.sh /opt/venv

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Kubernetes scheduler extender sharing NVIDIA GPUs (MIG, MPS, time-slicing)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 gpuslice \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpuslice
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
EXPOSE 8686 8443
# For `docker run`; Kubernetes uses the probes in manifests/deployment.yaml instead.
# Plain HTTP unless GPUSLICE_TLS_CERT is set; no curl in the image, Python's urllib does it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os, ssl, urllib.request; tls = bool(os.environ.get('GPUSLICE_TLS_CERT')); url = ('https' if tls else 'http') + '://127.0.0.1:' + os.environ.get('GPUSLICE_PORT', '8686') + '/healthz'; urllib.request.urlopen(url, timeout=4, context=ssl._create_unverified_context() if tls else None)"
ENTRYPOINT ["gpuslice"]
# No GPUSLICE_* settings in ENV: the environment overrides `serve --config`, so a default here
# would silently beat the ConfigMap. The listen address is a flag of this default command;
# Kubernetes replaces the command (manifests/deployment.yaml: serve --config ...).
CMD ["serve", "--host", "0.0.0.0"]
