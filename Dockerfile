# syntax=docker/dockerfile:1
# The kvpilot operator image: `kvpilot run` (kopf) on CPython 3.11, nothing else.
#
# Two stages so that the image that runs in the cluster holds no build backend, no source tree and no
# pip cache: the builder turns the repository into wheels (ours plus every dependency), the final
# stage installs them offline into a virtualenv and removes the installers.
#
#   docker build -t ghcr.io/kvpilot/kvpilot:0.1.0 --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#
# PYTHON_IMAGE is any image with CPython 3.11 as `python3` and its venv module: users get the public
# python:3.11-slim; CI (`make images`, hack/images/build.sh) passes a base bootstrapped from Debian's own
# packages, because no image registry is reachable there. The virtualenv (not the system site-packages)
# is what makes one Dockerfile work on both: Debian's python3 is "externally managed" (PEP 668).
# Pin PYTHON_IMAGE by digest in release builds (python:3.11-slim@sha256:...) so a rebuild is reproducible.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest of the repository out of the context).
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY simulator/ simulator/
# A wheel of kvsim (simulator/, its own distribution), one of kvpilot, and one of every runtime dependency,
# resolved here once; naming ./simulator makes pip take kvpilot's `kvsim==0.1.0` from it, never from an
# index. The final stage installs exactly these files.
RUN python3 -m venv /build \
 && /build/bin/pip wheel --wheel-dir /wheels './simulator[serve]' .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kvpilot" \
      org.opencontainers.image.description="Kubernetes operator that builds TensorRT-LLM engines, serves them and retunes max_batch_size from the KV-cache pool" \
      org.opencontainers.image.source="https://github.com/kvpilot/kvpilot" \
      org.opencontainers.image.url="https://github.com/kvpilot/kvpilot" \
      org.opencontainers.image.documentation="https://github.com/kvpilot/kvpilot/blob/main/docs/install.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="kvpilot" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    PATH=/opt/kvpilot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The wheels are bind-mounted from the builder, so they never become a layer of this image. After the
# install, pip, setuptools and wheel go too (the venv's, and the public base's own): nothing installs or builds at run time.
# The operator uses kvsim only as a model library (the tuner's what-if check), so the parts of kvsim it never
# imports go: the simulated trtllm-serve and trtllm-build, the kvsim CLI and its offline tools. That list is
# checked against the operator's imports by tests/unit/test_import_graph.py; the import below proves the
# operator's modules still load without them. kvpilot's own benchmark (`kvpilot bench`, kvpilot/bench) goes
# too: it runs from a source checkout or `pip install 'kvpilot[bench]'`, never in the cluster (the CLI then says
# so; tests/unit/test_operator_image.py).
ARG KVSIM_NOT_IN_OPERATOR="serve trtllm cli.py bench.py calibration.py claims.py plots.py perturb.py multinode.py sshd.py"
ARG KVPILOT_NOT_IN_OPERATOR="bench"
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python3 -m venv /opt/kvpilot \
 && /opt/kvpilot/bin/pip install --no-index --find-links=/wheels kvpilot \
 && cd /opt/kvpilot/lib/python3*/site-packages/kvsim \
 && for part in $KVSIM_NOT_IN_OPERATOR; do rm -r -- "$part" && rm -f -- __pycache__/"${part%.py}".*.pyc; done \
 && rm -- /opt/kvpilot/bin/kvsim \
 && cd /opt/kvpilot/lib/python3*/site-packages/kvpilot \
 && for part in $KVPILOT_NOT_IN_OPERATOR; do rm -r -- "$part"; done && cd / \
 && /opt/kvpilot/bin/python -c 'import kvpilot.operator, kvpilot.autotune.policy, kvpilot.desired.plan' \
 && /opt/kvpilot/bin/python -c 'import importlib.util as u; assert u.find_spec("kvpilot.bench") is None' \
 && /opt/kvpilot/bin/pip uninstall --yes setuptools wheel pip \
 && { python3 -m pip uninstall --yes setuptools wheel pip 2>/dev/null || true; } \
 && kvpilot --help >/dev/null
# A numeric uid:gid, so the kubelet can verify runAsNonRoot without /etc/passwd; the Helm chart runs
# the pod as the same uid (podSecurityContext.runAsUser).
USER 65532:65532
# --metrics-port (Prometheus /metrics) and --health-port (kopf's /healthz).
EXPOSE 8080 8081
ENTRYPOINT ["kvpilot"]
CMD ["run", "--all-namespaces"]
