"""Large payloads outside the history: Temporal's External Storage, with a store.

A payload over a threshold (a whole tool result, a model call's new messages, a
turn's answer with its story) is written to a store; the history holds a reference
of about 200 bytes. Temporal's SDK does the rest: the worker that reads the history
reads the store, so a turn's history stays small however much its tools return.
With encryption on (`durable_agent/runtime/codec.py`), a payload is encrypted before
it is stored: the store holds ciphertext only.

    AGENT_PAYLOAD_STORE       off (default): every payload inline, as before;
                              local: a folder under AGENT_STATE_DIR, `<state
                              dir>/payloads`, shared by the processes of one machine
                              (the embedded server's); local:/some/folder (a shared
                              one, for several machines); s3://BUCKET: an S3 bucket,
                              through Temporal's S3 driver (boto3, the `aws` extra;
                              its usual AWS_* settings, AWS_ENDPOINT_URL_S3 included)
    AGENT_PAYLOAD_THRESHOLD   bytes from which a payload is stored (default 4096)

Every process that reads the turns (workers, `client.py`, the codec server) must see
the same store, so it is off unless asked for: a store that one process wrote and
another cannot see would leave a turn unreadable there.

The folder holds one file per payload, `<namespace>/<workflow id>/<sha256>`: a payload
stored twice by a workflow is one file. `sweep` deletes the folders of workflows
closed for longer than a retention (the namespace's), as the server deletes their
histories: every worker with a local store does so once an hour (`keep_swept`;
AGENT_PAYLOAD_RETENTION, e.g. `7d`, sets another retention), and
`python -m durable_agent.runtime.storage sweep --retention 7d` does it by hand. In S3, the
driver's keys name the namespace, workflow and run (`v0/ns/…/wi/<workflow id>/ri/…`);
a lifecycle rule on the bucket expires them after the namespace's retention.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.settings import state_dir

STORE_ENV = "AGENT_PAYLOAD_STORE"
THRESHOLD_ENV = "AGENT_PAYLOAD_THRESHOLD"
RETENTION_ENV = "AGENT_PAYLOAD_RETENTION"
SWEEP_EVERY = timedelta(hours=1)
"""How often a worker deletes the stored payloads of workflows closed past the retention."""
DEFAULT_THRESHOLD = 4096
"""Bytes: a tool result of a few kilobytes already costs the history only a reference."""
FOLDER_DRIVER = "durable-agent.folder"

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
"""An S3 bucket's name, as S3 allows it."""
_KEY = re.compile(r"^[A-Za-z0-9%._-]{1,255}/[A-Za-z0-9%._-]{1,255}/[0-9a-f]{64}$")
"""A stored payload's key: nothing a claim names can leave the store's folder."""


class StorageConfigError(ValueError):
    """The payload store settings cannot work; the message says what to change."""


class PayloadMissing(LookupError):
    """A history refers to a stored payload the store does not have."""


class FolderStorageDriver(StorageDriver):
    """Payloads as files in a folder, one per payload, by workflow."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()

    def name(self) -> str:
        return FOLDER_DRIVER

    def type(self) -> str:
        return FOLDER_DRIVER

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        return [self._store_one(context, p) for p in payloads]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return [self.read(c.claim_data.get("key", "")) for c in claims]

    def read(self, key: str) -> Payload:
        if not _KEY.match(key):
            raise PayloadMissing(f"{key!r} is not a key of this payload store")
        try:
            return Payload.FromString((self.root / key).read_bytes())
        except FileNotFoundError:
            raise PayloadMissing(
                f"stored payload {key} is not in {self.root}: every process reading these "
                f"turns must use the same {STORE_ENV}, and payloads are deleted with their "
                "workflow's history (`sweep`)"
            ) from None

    def _store_one(
        self, context: StorageDriverStoreContext, payload: Payload
    ) -> StorageDriverClaim:
        data = payload.SerializeToString()
        key = f"{_folder_of(context)}/{hashlib.sha256(data).hexdigest()}"
        path = self.root / key
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # Whole or not at all: a reader never sees half a payload.
            partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
            partial.write_bytes(data)
            os.replace(partial, path)
        return StorageDriverClaim(claim_data={"key": key})

    def workflows(self) -> list[tuple[str, str, Path]]:
        """(namespace, workflow id, folder) of every workflow with stored payloads."""
        if not self.root.is_dir():
            return []
        return [
            (unquote(ns.name), unquote(wf.name), wf)
            for ns in self.root.iterdir()
            if ns.is_dir()
            for wf in ns.iterdir()
            if wf.is_dir()
        ]


class Boto3S3Client(S3StorageDriverClient):
    """Temporal's S3 driver over a boto3 client (the project's `aws` extra), its calls
    in threads so the worker's event loop goes on meanwhile."""

    def __init__(self, s3: Any) -> None:
        self._s3 = s3

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._s3.put_object, Bucket=bucket, Key=key, Body=data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        try:
            await asyncio.to_thread(self._s3.head_object, Bucket=bucket, Key=key)
        except self._s3.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        def read() -> bytes:
            body: bytes = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        return await asyncio.to_thread(read)

    def describe(self) -> Mapping[str, str]:
        return {"region": str(self._s3.meta.region_name), "endpoint": self._s3.meta.endpoint_url}


def s3_driver(bucket: str, s3: Any = None) -> S3StorageDriver:
    """Temporal's S3 driver for `bucket` (which must exist), with a boto3 client made
    from the environment's AWS settings unless `s3` is given."""
    if s3 is None:
        try:
            boto3 = importlib.import_module("boto3")
        except ImportError:
            raise StorageConfigError(
                f"{STORE_ENV}=s3://{bucket} needs boto3: pip install 'durable-agent[aws]'"
            ) from None
        s3 = boto3.client("s3")
    return S3StorageDriver(client=Boto3S3Client(s3), bucket=bucket)


def _folder_of(context: StorageDriverStoreContext) -> str:
    """`<namespace>/<workflow id>`, each percent-encoded (a long id: its hash)."""
    target = context.target
    namespace = target.namespace if target is not None else ""
    owner = target.id if isinstance(target, StorageDriverWorkflowInfo) and target.id else ""
    return f"{_segment(namespace or '_')}/{_segment(owner or '_')}"


def _segment(text: str) -> str:
    quoted = quote(text, safe="").replace("~", "%7E")
    if len(quoted) > 200:
        return "h-" + hashlib.sha256(text.encode()).hexdigest()
    return quoted


def external_storage(environ: Mapping[str, str] | None = None) -> ExternalStorage | None:
    """The payload store AGENT_PAYLOAD_STORE names (None: off)."""
    env = os.environ if environ is None else environ
    spec = env.get(STORE_ENV, "").strip() or "off"
    threshold = _threshold(env.get(THRESHOLD_ENV, "").strip())
    driver: StorageDriver
    if spec == "off":
        return None
    if spec == "local":
        driver = FolderStorageDriver(state_dir(env) / "payloads")
    elif spec.startswith("local:"):
        driver = FolderStorageDriver(spec.removeprefix("local:"))
    elif spec.startswith("s3://") and _BUCKET.match(spec.removeprefix("s3://").rstrip("/")):
        driver = s3_driver(spec.removeprefix("s3://").rstrip("/"))
    else:
        raise StorageConfigError(
            f"{STORE_ENV}={spec!r}: use local, local:/a/folder, s3://a-bucket or off"
        )
    return ExternalStorage(drivers=[driver], payload_size_threshold=threshold)


def _threshold(text: str) -> int:
    if not text:
        return DEFAULT_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise StorageConfigError(f"{THRESHOLD_ENV}={text!r}: give a number of bytes, e.g. 4096")
    return value


async def sweep(
    client: Client,
    driver: FolderStorageDriver,
    retention: timedelta,
    *,
    now: datetime | None = None,
) -> list[str]:
    """Delete the stored payloads of workflows closed for longer than `retention` (or
    gone from the server); the ids of the workflows whose payloads went."""
    now = now or datetime.now(timezone.utc)
    gone = []
    for namespace, workflow_id, folder in driver.workflows():
        if namespace != client.namespace:
            continue
        newest = max((p.stat().st_mtime for p in folder.iterdir()), default=0.0)
        if time.time() - newest < retention.total_seconds():
            continue  # written to within the retention: its workflow cannot have closed before
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            closed = True  # the server has deleted its history already
        else:
            closed = (
                described.status is not None
                and described.status != WorkflowExecutionStatus.RUNNING
                and described.close_time is not None
                and now - described.close_time > retention
            )
        if closed:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(workflow_id)
    return gone


async def retention_of(client: Client, environ: Mapping[str, str] | None = None) -> timedelta:
    """How long stored payloads outlive their closed workflows: AGENT_PAYLOAD_RETENTION,
    else the namespace's own retention (as long as the server keeps their histories)."""
    environ = os.environ if environ is None else environ
    if text := environ.get(RETENTION_ENV, "").strip():
        try:
            return _duration(text)
        except argparse.ArgumentTypeError as e:
            raise StorageConfigError(f"{RETENTION_ENV}: {e}") from None
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    described = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=client.namespace)
    )
    return described.config.workflow_execution_retention_ttl.ToTimedelta()


async def keep_swept(
    client: Client,
    driver: FolderStorageDriver,
    retention: timedelta | None = None,
    every: timedelta = SWEEP_EVERY,
) -> None:
    """Sweep the store now and then, for as long as it runs (a worker's background task):
    several workers sweeping one folder only delete what is gone for good."""
    import logging

    log = logging.getLogger(__name__)
    while True:
        await asyncio.sleep(every.total_seconds())
        try:
            kept = retention if retention is not None else await retention_of(client)
            if gone := await sweep(client, driver, kept):
                log.info("payload store: deleted the payloads of %d closed workflow(s)", len(gone))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the server away for a while: the next sweep catches up
            log.warning("payload store: not swept this time (%s)", e)


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"give a duration like 7d, 12h or 30m, not {text!r}")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match[2]]
    return timedelta(**{unit: float(match[1])})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agent.runtime.storage",
        description="Delete the stored payloads of closed workflows (the local store).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("sweep", help="delete payloads of workflows closed past the retention")
    run.add_argument("--retention", type=_duration, default=timedelta(days=7))
    args = parser.parse_args(argv)
    storage = external_storage()
    driver = storage.drivers[0] if storage is not None else None
    if not isinstance(driver, FolderStorageDriver):
        print(
            f"{STORE_ENV} names no local folder: nothing to sweep (in S3, a lifecycle rule "
            "on the bucket expires stored payloads)",
            file=sys.stderr,
        )
        return 2

    async def go() -> list[str]:
        from durable_agent.runtime.server import connect

        connection = await connect()
        return await sweep(connection.client, driver, args.retention)

    gone = asyncio.run(go())
    print(f"deleted the stored payloads of {len(gone)} workflow(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
