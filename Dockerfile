# syntax=docker/dockerfile:1
# One image for every component: `slurm-bridge worker` and `slurm-bridge webhook`
# (and the operator commands: status, list, retry, doctor), chosen by the arguments.
#
#   docker build -t slurm-bridge:0.1.0 .          (0.1.0: the chart's appVersion)
#   docker run --rm slurm-bridge:0.1.0 --help
#   ./dev image                                   the same build without a Docker daemon (hack/image.sh)
#
# The base is Debian with Debian's own Python, not python:*-slim. Why: the image
# must be buildable where no registry can be reached, from Debian's archive
# alone, and the local base and the production one must not differ in Python
# version, libc or paths. hack/image.sh makes its stand-in for this tag with
# mmdebstrap: the same suite (so Debian's same python3, glibc and paths, all
# installed by the RUN below in both cases), the slim image's dpkg excludes and
# apt sources; only its packages are the archive's current point release rather
# than the tag date's snapshot. A python:*-slim base would instead need CPython
# built from source to be reproduced locally, under /usr/local. Debian
# bookworm's python3 is 3.11, the version the whole test suite runs on
# (pyproject's requires-python, mypy's python_version) and the one the pins in
# constraints.txt have wheels for; trixie's is 3.13, which nothing here tests.
# Moving to trixie means moving the project to 3.13 first.
# The tag is pinned to a dated build so a rebuild does not silently change the
# base; bump it deliberately (tests/deploy/test_dockerfile.py checks the pin,
# and hack/image.sh keys its cached local base by this tag).
ARG DEBIAN_IMAGE=debian:bookworm-20251229-slim

# Python from Debian, shared by the build and the runtime stages (one apt
# layer). ca-certificates: Temporal Cloud and other TLS peers are verified
# against the system store, as they were in the python image.
FROM ${DEBIAN_IMAGE} AS base
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# The dependencies alone, in a stage of their own: the runtime copies this
# virtualenv as one layer that changes only when the pins do, and the code
# comes after it in a small layer of its own.
FROM base AS deps
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A virtualenv, so the runtime stage copies exactly one directory.
RUN python3 -m venv /opt/slurm-bridge
WORKDIR /src
# Only what the dependency list is made of: a README or code change keeps this layer.
# constraints.txt pins every transitive dependency, the same versions CI tests.
COPY pyproject.toml constraints.txt ./
# The secret `pip-ca` is an optional CA bundle for PyPI behind a TLS-intercepting
# proxy (hack/image.sh passes the host's); a secret mount is never committed.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
       > requirements.txt \
    && /opt/slurm-bridge/bin/pip install pip==25.3 \
    && /opt/slurm-bridge/bin/pip install -c constraints.txt -r requirements.txt

FROM deps AS build
COPY README.md ./
COPY bridge ./bridge
COPY clients ./clients
COPY activities ./activities
COPY workflows ./workflows
COPY worker ./worker
COPY webhook ./webhook
# Not editable, no test extras: the image carries only what runs in production.
# /layer receives exactly the files this install added (the packages, their
# dist-info, the entry script), for the runtime's code layer.
# pip fetches the build backend (setuptools) here: the same optional CA bundle.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/slurm-bridge/bin/pip install -c constraints.txt --no-deps . \
    && /opt/slurm-bridge/bin/slurm-bridge --help >/dev/null \
    && site=$(/opt/slurm-bridge/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && mkdir -p "/layer$site" /layer/opt/slurm-bridge/bin \
    && cp -a "$site/bridge" "$site/clients" "$site/activities" "$site/workflows" "$site/worker" "$site/webhook" \
       "$site"/slurm_bridge-*.dist-info "/layer$site/" \
    && cp -a /opt/slurm-bridge/bin/slurm-bridge /layer/opt/slurm-bridge/bin/

FROM base
LABEL org.opencontainers.image.title="slurm-bridge" \
      org.opencontainers.image.description="Scheduled by Slurm, run by Kubernetes: places Kubernetes pods with Slurm external jobs" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid: Kubernetes can only enforce runAsNonRoot against a
# numeric USER, and the Helm chart's securityContext uses the same ids.
RUN groupadd --system --gid 10001 slurm-bridge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin slurm-bridge
COPY --from=deps /opt/slurm-bridge /opt/slurm-bridge
COPY --from=build /layer/ /
# The root filesystem may be read-only (the chart mounts it so): bytecode was
# compiled at install time, and HOME points at /tmp, the one writable place.
ENV PATH=/opt/slurm-bridge/bin:$PATH \
    HOME=/tmp \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
# Worker metrics (Prometheus), the worker's health probes, the webhook's HTTPS port.
EXPOSE 9464 9465 9443
ENTRYPOINT ["slurm-bridge"]
CMD ["--help"]
