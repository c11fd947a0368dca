# The qoss API image: Debian 12's Python 3.11, the locked runtime packages (hash-checked,
# nothing else), and qoss built from this checkout without dependencies. It migrates its
# database at start, then serves on port 8000 (deploy/api/qoss-container).
#
# BASE is the Debian 12 image to build on: debian:bookworm-slim where a registry is at hand;
# scripts/compose-check.sh builds FROM localhost/qoss-base:bookworm (deploy/base/), made
# locally with debootstrap, and mounts the host's CA bundle for pip (PIP_CERT).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# A CA bundle for pip, e.g. behind an intercepting proxy: a path mounted at build time.
ARG PIP_CERT
WORKDIR /srv/qoss
COPY requirements/runtime.txt requirements/runtime.txt
RUN python3 -m venv /opt/qoss \
 && /opt/qoss/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      -r requirements/runtime.txt
COPY pyproject.toml ./
COPY app ./app
COPY ratings ./ratings
COPY policies ./policies
COPY migrations ./migrations
RUN /opt/qoss/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation . \
 && rm -rf /srv/qoss
COPY deploy/api/qoss-container /usr/local/bin/qoss-container
# qoss runs as the unprivileged system user qoss, which owns its data directory (and the
# service's own directory in it, QOSS_STATE_DIR). It reaches the gateways' VICI sockets,
# shared through volumes, as a member of the group qoss-vici: the gateway image has the same
# group (the same gid) and its charon gives the socket that group (charon.group).
RUN groupadd --system --gid 991 qoss-vici \
 && groupadd --system --gid 990 qoss \
 && useradd --system --uid 990 --gid qoss --groups qoss-vici --home-dir /var/lib/qoss --no-create-home \
      --shell /usr/sbin/nologin qoss \
 && install -d -o qoss -g qoss -m 0700 /var/lib/qoss
ENV PATH=/opt/qoss/bin:$PATH QOSS_STATE_DIR=/var/lib/qoss/state
WORKDIR /var/lib/qoss
EXPOSE 8000
USER qoss
ENTRYPOINT ["qoss-container"]
CMD ["serve"]
