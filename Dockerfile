# The qoss API image (docker-compose.yml). Not buildable on the development machines
# here (no Docker engine); kept consistent with scripts/setup.sh.
FROM python:3.11-slim-bookworm
WORKDIR /srv/qoss
COPY pyproject.toml README.md ./
COPY app ./app
COPY alembic.ini ./
RUN pip install --no-cache-dir .
ENV QOSS_HOST=0.0.0.0 QOSS_PORT=8000
EXPOSE 8000
CMD ["qoss", "serve", "--host", "0.0.0.0"]
