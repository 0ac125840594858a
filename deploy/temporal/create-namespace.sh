#!/bin/sh
# Registers the namespace the workers use once the server is healthy, and waits
# until the frontend serves it, so a worker that starts next finds it.
# Safe to run on every `docker compose up`.
set -eu

: "${TEMPORAL_ADDRESS:?set TEMPORAL_ADDRESS to the frontend, e.g. temporal:7233}"
ns=${TEMPORAL_NAMESPACE:-default}
retention=${TEMPORAL_NAMESPACE_RETENTION:-72h}

retry() {  # retry WHAT COMMAND...: every 2 s, for at most 2 minutes
  what=$1
  shift
  n=0
  until "$@" >/dev/null 2>&1; do
    n=$((n + 1))
    if [ "$n" -ge 60 ]; then
      echo "namespace: $what did not happen within 2 minutes; see \`docker compose logs temporal\`" >&2
      exit 1
    fi
    sleep 2
  done
}

retry "the server at $TEMPORAL_ADDRESS becoming healthy" temporal operator cluster health
if temporal operator namespace describe --namespace "$ns" >/dev/null 2>&1; then
  echo "namespace: $ns exists"
else
  temporal operator namespace create --namespace "$ns" --retention "$retention"
  echo "namespace: $ns created (retention $retention)"
fi
retry "namespace $ns reaching the frontend" temporal workflow list --namespace "$ns" --limit 1
echo "namespace: $ns ready"
