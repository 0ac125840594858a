#!/bin/sh
# Creates Temporal's two PostgreSQL databases (history and visibility) and brings
# their schemas up to the version this admin-tools image ships.
#
# Runs before the server on every `docker compose up`: creating a database that
# exists is a no-op, the initial version is set only once, and update-schema
# applies only the versions the database lacks. Upgrading the pinned Temporal
# images therefore migrates the schema first, the way Temporal expects.
set -eu

: "${POSTGRES_SEEDS:?set POSTGRES_SEEDS to the PostgreSQL host}"
: "${POSTGRES_USER:?set POSTGRES_USER}"
: "${POSTGRES_PWD:?set POSTGRES_PWD}"
# temporal-sql-tool reads the password from here, so it never shows in `ps`.
export SQL_PASSWORD="$POSTGRES_PWD"

schemas=/etc/temporal/schema/postgresql/v12

sql() {
  temporal-sql-tool --plugin "${DB:-postgres12}" --ep "$POSTGRES_SEEDS" \
    -p "${DB_PORT:-5432}" -u "$POSTGRES_USER" "$@"
}

for pair in "${DBNAME:-temporal}:temporal" "${VISIBILITY_DBNAME:-temporal_visibility}:visibility"; do
  db=${pair%%:*}
  kind=${pair#*:}
  echo "schema: database $db ($kind)"
  sql --db "$db" create
  sql --db "$db" setup-schema -v 0.0
  sql --db "$db" update-schema -d "$schemas/$kind/versioned"
done
echo "schema: ready"
