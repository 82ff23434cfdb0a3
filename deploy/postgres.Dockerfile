# PostgreSQL 15 from Debian's packages on the local base image, for the compose stack where no registry is
# reachable (deploy/compose.local.yml; built by `deploy/local-engine.sh images`). Same contract as the
# official postgres image: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, data in /var/lib/postgresql/data;
# plus PGPORT (default 5432): with host networking the port must not clash with a PostgreSQL on the host.
ARG BASE_IMAGE=local/debian-python:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /run/postgresql
COPY deploy/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data PGPORT=5432
USER postgres
ENTRYPOINT ["/bin/sh", "/usr/local/bin/postgres-entrypoint.sh"]
