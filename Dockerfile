# The qoss API image: Debian 12's Python 3.11, the locked runtime packages (hash-checked,
# nothing else), and qoss built from this checkout. scripts/compose-check.sh builds it on a
# base image made locally with debootstrap (BASE); with a registry at hand the default works.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# A CA bundle for pip behind an intercepting proxy (mounted at build time by compose-check.sh).
ARG PIP_CERT
WORKDIR /srv/qoss
COPY requirements/runtime.txt requirements/runtime.txt
RUN python3 -m venv /opt/qoss \
 && /opt/qoss/bin/pip install --no-cache-dir --disable-pip-version-check --require-hashes \
      -r requirements/runtime.txt
COPY pyproject.toml ./
COPY app ./app
RUN /opt/qoss/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation . \
 && rm -rf build ./*.egg-info
COPY deploy/api/qoss-container /usr/local/bin/qoss-container
ENV PATH=/opt/qoss/bin:$PATH
WORKDIR /var/lib/qoss
EXPOSE 8000
# Runs as root: the gateways' VICI sockets, shared through volumes, are root's.
ENTRYPOINT ["qoss-container"]
CMD ["serve"]
