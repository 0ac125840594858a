"""Secrets out of histories: a turn's secret context values travel by reference.

A caller marks context values secret (`durable_agent.Secret`, or `secret=[keys]` on
`ask`/`start`/`chat`). The client takes them out of the context, encrypts them with
AGENT_ENCRYPTION_KEY and stores them in the payload store (`runtime/storage.py`), in
the folder of the workflow they are given to (the turn, or the conversation). The
context keeps a reference in their place, under `SECRETS_KEY`: the store's driver, the
claim (its key ends with the sha256 of the ciphertext, which no one guesses), the
workflow it is stored under and the names of the values. That is all the history, the
memo, a trace, the Web UI, `show`, `export` and the story ever hold.

Inside an activity (a tool's dispatch, an instructions function), `revealed` reads
the reference, checks that it is stored under the workflow it names and that the
customer sealed inside it is the turn's, decrypts it and gives the values in the
context: a tool reads `ctx.context["api_key"]` as it reads any other value. What the
activity returns is masked (`durable_agent.secret.masked`) before it enters the
history: a tool that echoes the key gives `[secret api_key]` to the model and the record.

No key, no secrets: without AGENT_ENCRYPTION_KEY a stored value would be plain bytes
on the store's disk, protected by file permissions only, so the client refuses a turn
with secrets in one line (`InvalidSecret`), and the same with the payload store off.
The entry lives as long as the workflow's folder: the sweep that deletes a closed
workflow's payloads deletes its secrets too. A fork or rerun carries the original's
reference and reads it while the original's entry is there; after that it ends with
`payload_unavailable`, saying to start the turn again with the secrets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)

from durable_agent.errors import InvalidSecret, PayloadUnavailable
from durable_agent.runtime.codec import (
    KEY_ENV,
    DecryptionError,
    EncryptionCodec,
    EncryptionConfigError,
    key_ring_from_env,
)
from durable_agent.runtime.storage import (
    STORE_ENV,
    UNSTORED,
    FolderStorageDriver,
    Owner,
    S3Store,
    external_storage,
)
from durable_agent.secret import SECRETS_KEY


async def _read(driver: StorageDriver, claim: StorageDriverClaim) -> Payload:
    """The stored payload, checked as any is (hash, the owner's folder). Read directly:
    the SDK's path also watches the owner's workflow task, which is not this one's."""
    if isinstance(driver, FolderStorageDriver):
        return driver.read(claim.claim_data.get("key", ""), claim.claim_data)
    if isinstance(driver, S3Store):
        return await driver._read_checked(claim.claim_data)
    [stored] = await driver.retrieve(StorageDriverRetrieveContext(), [claim])
    return stored


def _codec(environ: Mapping[str, str] | None = None) -> EncryptionCodec | None:
    ring = key_ring_from_env(environ)
    return EncryptionCodec(ring) if ring is not None else None


async def sealed(
    secrets: Mapping[str, Any],
    *,
    customer_id: str,
    namespace: str,
    workflow_id: str,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Store `secrets`, encrypted, under `workflow_id`: the reference a context holds in
    their place (`SECRETS_KEY`). `InvalidSecret` when there is no key or no store."""
    try:
        codec = _codec(environ)
        storage = external_storage(environ)
    except (EncryptionConfigError, ValueError) as e:
        raise InvalidSecret(str(e)) from None
    if codec is None:
        raise InvalidSecret(
            f"secrets need {KEY_ENV} on the client and the workers: without it they would "
            "be stored in clear; set it (openssl rand -base64 32), or pass the value as "
            "plain context"
        )
    driver = storage.storing
    if driver is None:
        raise InvalidSecret(
            f"secrets travel through the payload store, and {STORE_ENV}=off: set it to "
            "local, local:/a/folder or s3://BUCKET"
        )
    # The customer is sealed with the values: a reader compares it, never an id.
    plain = json.dumps({"customer": customer_id, "values": dict(secrets)}).encode()
    payload = codec.encrypt(Payload(metadata={"encoding": b"json/plain"}, data=plain))
    owner = Owner(namespace, workflow_id)
    bound = driver.owned_by(owner) if hasattr(driver, "owned_by") else driver
    target = StorageDriverWorkflowInfo(namespace=namespace, id=workflow_id)
    [claim] = await bound.store(StorageDriverStoreContext(target=target), [payload])
    if UNSTORED in claim.claim_data:
        raise InvalidSecret(
            f"the payload store {driver} cannot store the secrets "
            f"({claim.claim_data[UNSTORED]}): fix the store and ask again"
        )
    return {
        "driver": driver.name(),
        "claim": dict(claim.claim_data),
        "namespace": namespace,
        "workflow": workflow_id,
        "keys": sorted(secrets),
    }


async def revealed(
    context: Mapping[str, Any], customer_id: str, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The context with its secrets in clear, and the secrets; for an activity only.
    `PayloadUnavailable` (the turn ends saying it) when they cannot be had."""
    ref = context.get(SECRETS_KEY)
    if ref is None:
        return dict(context), {}
    plain = {k: v for k, v in context.items() if k != SECRETS_KEY}
    if not isinstance(ref, dict) or not isinstance(ref.get("claim"), dict):
        raise PayloadUnavailable(f"the context's {SECRETS_KEY!r} is no secret reference: refused")
    workflow = str(ref.get("workflow", ""))
    keys = ", ".join(map(str, ref.get("keys", [])))

    def again(why: object) -> str:
        return (
            f"the secrets {keys} of {workflow} cannot be had ({why}): start the turn "
            "again, giving them (secret=...)"
        )

    try:
        codec = _codec(environ)
        storage = external_storage(environ)
    except (EncryptionConfigError, ValueError) as e:
        raise PayloadUnavailable(again(e)) from None
    if codec is None:
        raise PayloadUnavailable(again(f"this worker has no {KEY_ENV}"))
    driver = storage._get_driver_by_name(str(ref.get("driver", "")))
    owner = Owner(str(ref.get("namespace", "")), workflow)
    bound = driver.owned_by(owner) if hasattr(driver, "owned_by") else driver
    claim = StorageDriverClaim(claim_data={str(k): str(v) for k, v in ref["claim"].items()})
    try:
        stored = await _read(bound, claim)
        opened = json.loads(codec.decrypt(stored).data)
    except PayloadUnavailable as e:
        raise PayloadUnavailable(again(e)) from None
    except (DecryptionError, ValueError) as e:
        raise PayloadUnavailable(again(e)) from None
    if opened.get("customer") != customer_id:
        raise PayloadUnavailable(
            f"the secrets of {workflow} were given for another customer: refused"
        )
    values = dict(opened.get("values", {}))
    return {**plain, **values}, values
