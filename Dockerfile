# syntax=docker/dockerfile:1
# One image for every component: `slurm-bridge worker` and `slurm-bridge webhook`
# (and the operator commands: status, list, retry), chosen by the arguments.
#
#   docker build -t slurm-bridge:0.1.0 .
#   docker run --rm slurm-bridge:0.1.0 --help
#
# The base is pinned to a patch release so a rebuild does not silently change
# Python; bump it deliberately (tests/deploy/test_dockerfile.py checks the pin).
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtualenv, so the runtime stage copies exactly one directory.
RUN python -m venv /opt/slurm-bridge
WORKDIR /src
# Dependencies first, in their own layer: they change far less often than the code.
# constraints.txt pins every transitive dependency, the same versions CI tests.
COPY pyproject.toml constraints.txt README.md ./
RUN python -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
       > requirements.txt \
    && /opt/slurm-bridge/bin/pip install pip==25.3 \
    && /opt/slurm-bridge/bin/pip install -c constraints.txt -r requirements.txt
COPY bridge ./bridge
COPY activities ./activities
COPY workflows ./workflows
COPY worker ./worker
COPY webhook ./webhook
# Not editable, no test extras: the image carries only what runs in production.
RUN /opt/slurm-bridge/bin/pip install -c constraints.txt --no-deps . \
    && /opt/slurm-bridge/bin/slurm-bridge --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="slurm-bridge" \
      org.opencontainers.image.description="Scheduled by Slurm, run by Kubernetes: places Kubernetes pods with Slurm external jobs" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid: Kubernetes can only enforce runAsNonRoot against a
# numeric USER, and the Helm chart's securityContext uses the same ids.
RUN groupadd --system --gid 10001 slurm-bridge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin slurm-bridge
COPY --from=build /opt/slurm-bridge /opt/slurm-bridge
# The root filesystem may be read-only (the chart mounts it so): bytecode was
# compiled at install time, and HOME points at /tmp, the one writable place.
ENV PATH=/opt/slurm-bridge/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
# Worker metrics (Prometheus) and the webhook's HTTPS port.
EXPOSE 9464 9465 9443
ENTRYPOINT ["slurm-bridge"]
CMD ["--help"]
