"""Large payloads outside the history: Temporal's External Storage, with a store.

A payload over a threshold (a whole tool result, a model call's new messages, a
turn's answer with its story) is written to a store; the history holds a reference
of about 200 bytes. Temporal's SDK does the rest: the worker that reads the history
reads the store, so a turn's history stays small however much its tools return.
With encryption on (`durable_agent/runtime/codec.py`), a payload is encrypted before
it is stored: the store holds ciphertext only.

    AGENT_PAYLOAD_STORE       where this process stores payloads: local (default): a
                              folder under AGENT_STATE_DIR, `<state dir>/payloads`, beside
                              the embedded server's database and shared by the processes
                              of one machine that use that state folder; local:/some/folder
                              (a shared one, for several machines); s3://BUCKET: an S3
                              bucket, through Temporal's S3 driver (boto3, the `aws` extra;
                              its usual AWS_* settings, AWS_ENDPOINT_URL_S3 included); off:
                              nowhere, every payload inline in the history
    AGENT_PAYLOAD_READ        further stores this process reads, comma-separated
                              (local:/a/folder, s3://BUCKET): for one that stores
                              elsewhere, or nothing
    AGENT_PAYLOAD_THRESHOLD   bytes from which a payload is stored (default 4096)

Storing is the only choice. Every process reads whatever a history it reads refers
to, from the folder under AGENT_STATE_DIR (the `local` store's), from the store it
stores in, and from those AGENT_PAYLOAD_READ names: a client with the store off
still shows a turn whose worker stored its payloads. A payload in a store this
process does not read cannot be shown here, so every process reading the turns
should use the same AGENT_PAYLOAD_STORE (or name it in AGENT_PAYLOAD_READ).

The store is on by default, in the state folder, whatever the server: a long turn's
history otherwise grows with every tool result it reads, to Temporal's 50 MB limit per
run series. The processes that find the embedded server share its state folder by
construction (they find the server there); the processes of one project folder that
talk to a named server share it too. Workers on several machines do not: a deployment
names one store that all of them reach, once (`local:/shared/folder` or `s3://BUCKET`;
compose does), and a worker on a named server says where it stores when it starts.

Nothing read is trusted. A reference's key is refused unless it is a payload's place
in a store this process reads: no `.` or `..` segment, nothing absolute, an S3 bucket
this process was told of, and the folder of the workflow whose payload is being read.
That workflow is the SDK's serialization context, the same when a payload is written
as when it is read (a turn's own payloads and its activities' are the turn's; a
child's input and result are the child's), and payloads are stored under it: a
reference a client slips into a turn's input or an update cannot make the worker
read another workflow's payload. Every payload read is checked against the sha256
its key ends with (in S3, the claim's hash, which its key names too): a payload
altered in the store is never used. Readers with no context (the codec server, a
history read by hand) check everything but the workflow.

When a payload cannot be had, the turn ends: it never waits on a workflow task that
fails again and again. A read that fails for good (missing, altered, refused, in a store
this process does not read) raises `PayloadUnavailable` (`durable_agent/errors.py`), a
non-retryable `ApplicationError` whose one line names the payload, the store and what
to do. Where it is met decides how the turn ends:

    a workflow task, on the    the SDK fails the turn at once with it (any other error
    turn's newest events       would fail the task instead, retried forever)
    a workflow task replaying  failing the turn there would contradict the history not
    older events (a worker     replayed yet: the task fails, and the worker that met the
    restarted; the turn was    error terminates the turn, the line its reason
    out of its cache)          (`ending_stuck_turns`)
    an activity                it fails for good; the turn ends with the outcome
                               `payload_unavailable` and a step that says it
    a client                   the line (`AgentClient`, `client.py show`, the codec server)

`AgentClient.result()` gives a turn failed or terminated so as a result: the outcome
`payload_unavailable` and one step, the line. A write that fails (a full disk, a
read-only folder, a bucket refused) does not fail its task either: the reference records
that the payload was not stored, and why, and whoever reads it meets `PayloadUnavailable`
with that reason, so a turn whose store refuses writes ends at its next step. Only a read
that may work in a moment (S3 unreachable or throttled) fails the task, to be tried again.

The folder holds one file per payload, `<namespace>/<workflow id>/<sha256>`, each
name percent-encoded (a name over 200 characters: `h-` and its sha256, and the folder
records the workflow it belongs to in a `.workflow` file): a payload stored twice by
a workflow is one file. `sweep` deletes the folders of workflows closed for longer
than a retention (the namespace's), as the server deletes their histories, and keeps
a child's while its parent might still replay it; a folder that does not say which
workflow it holds is never deleted, nor a store whose `.server` file (written by its
first sweep) names another server than the sweeping worker's. Every worker storing in
a folder sweeps it once an hour (`keep_swept`; AGENT_PAYLOAD_RETENTION, e.g. `7d`, sets
another retention), and `python -m durable_agent.runtime.storage sweep --retention 7d`
does it by hand. In S3,
the keys name the namespace and workflow (`v0/ns/…/wt/null/wi/<workflow id>/ri/null/…`);
a lifecycle rule on the bucket expires them after the namespace's retention.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import importlib
import json
import logging
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.sdk.v1 import ExternalStorageReference
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    ExternalStorage,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.errors import PayloadUnavailable
from durable_agent.runtime.own_server import identify
from durable_agent.settings import state_dir

log = logging.getLogger(__name__)

STORE_ENV = "AGENT_PAYLOAD_STORE"
READ_ENV = "AGENT_PAYLOAD_READ"
THRESHOLD_ENV = "AGENT_PAYLOAD_THRESHOLD"
RETENTION_ENV = "AGENT_PAYLOAD_RETENTION"
SWEEP_EVERY = timedelta(hours=1)
"""How often a worker deletes the stored payloads of workflows closed past the retention."""
DEFAULT_STORE = "local"
"""On unless turned off: a folder under AGENT_STATE_DIR (see the module docstring)."""
DEFAULT_THRESHOLD = 4096
"""Bytes: a tool result of a few kilobytes already costs the history only a reference."""
FOLDER_DRIVER = "durable-agent.folder"
S3_DRIVER = "aws.s3driver"
"""Temporal's S3 driver's name, which its references carry."""
SERVER_FILE = ".server"
"""In a store's folder: the cluster id of the server whose workflows' payloads it holds
(`sweep`)."""
OWNER_FILE = ".workflow"
"""In a workflow's folder: the namespace and workflow id it holds payloads of."""
SAME_STORE = f"every process must use the same {STORE_ENV} (or name it in {READ_ENV})"
UNSTORED = "unstored"
"""A claim's entry when the store refused the payload: why (see `_unstored`)."""
MAX_REASON = 200

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
"""An S3 bucket's name, as S3 allows it."""
_SEGMENT = r"[A-Za-z0-9%._-]{1,255}"
_KEY = re.compile(rf"^({_SEGMENT})/({_SEGMENT})/([0-9a-f]{{64}})$")
"""A stored payload's key in a folder: `<namespace>/<workflow>/<sha256>`."""
_HASHED = re.compile(r"^h-[0-9a-f]{64}$")
_S3_SEGMENT = r"[A-Za-z0-9!_.*'()%-]{1,1024}"
_S3_KEY = re.compile(
    rf"^v0/ns/({_S3_SEGMENT})(?:/wt/({_S3_SEGMENT})/wi/({_S3_SEGMENT})/ri/({_S3_SEGMENT}))?"
    r"/d/sha256/([0-9a-f]{64})$"
)
"""A key of Temporal's S3 driver that names a namespace: `v0/ns/<ns>[/wt/<type>/wi/<id>/
ri/<run>]/d/sha256/<sha256>` (without the workflow when that would be over 1,024 bytes)."""
_S3_MAX_KEY = 1024
MAX_BOUND = 256
"""Contexts (workflows', activities') a process keeps its converter bound to, the most
recent (`StoreConverter.with_context`)."""
NEVER = 2**62
"""The threshold of a process that stores nothing: no payload is ever that large."""


class StorageConfigError(ValueError):
    """The payload store settings cannot work; the message says what to change."""


class Owner(NamedTuple):
    """The workflow a payload belongs to: where it is stored, and who may read it."""

    namespace: str
    workflow_id: str


def owner_of(context: SerializationContext) -> Owner | None:
    """The workflow of a serialization context (None: no workflow, e.g. a Nexus call)."""
    workflows = (WorkflowSerializationContext, ActivitySerializationContext)
    if isinstance(context, workflows) and context.workflow_id:
        return Owner(context.namespace, context.workflow_id)
    return None


class _OwnedDriver(StorageDriver):
    """A driver that knows whose payloads it stores and reads (`PayloadStore.with_context`)."""

    owner: Owner | None = None

    def owned_by(self, owner: Owner | None) -> _OwnedDriver:
        bound = copy.copy(self)
        bound.owner = owner
        return bound

    def _refused(self, key: str) -> PayloadUnavailable:
        whose = f"workflow {self.owner.workflow_id}'s" if self.owner else "a"
        return PayloadUnavailable(
            f"a reference in {whose} history names {_clip(key)!r}, which is not a payload of "
            f"that workflow in {self}: refused (a workflow reads its own payloads only)"
        )


class FolderStorageDriver(_OwnedDriver):
    """Payloads as files in a folder, one per payload, by workflow: stored in `root`,
    read from `root` and the folders `also` names."""

    def __init__(self, root: Path | str, also: Sequence[Path | str] = ()) -> None:
        self.root = Path(root).absolute()
        folders = dict.fromkeys(Path(f).absolute() for f in also)
        self.also = tuple(f for f in folders if f != self.root)

    def __str__(self) -> str:
        return f"local:{self.root}"

    def name(self) -> str:
        return FOLDER_DRIVER

    def type(self) -> str:
        return FOLDER_DRIVER

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        owner = self.owner or _target_owner(context)
        folder = _folder(owner)
        return [self._store_one(folder, owner, p) for p in payloads]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        with _ending_if_stuck(self.owner):
            return [self.read(c.claim_data.get("key", ""), c.claim_data) for c in claims]

    def read(self, key: str, claim: Mapping[str, str] | None = None) -> Payload:
        """The payload `key` names, whole and as stored; `PayloadUnavailable` otherwise."""
        found = _KEY.match(key)
        if not found or _dots(found[1]) or _dots(found[2]):
            raise PayloadUnavailable(
                f"a reference names {_clip(key)!r}, which is no payload's place in {self}: refused"
            )
        if self.owner is not None and f"{found[1]}/{found[2]}" != _folder(self.owner):
            raise self._refused(key)
        what = _payload_of(found[2], found[3])
        if claim is not None and UNSTORED in claim:
            raise _unstored(what, str(self), claim[UNSTORED])
        altered = []
        for root in (self.root, *self.also):
            try:
                data = (root / key).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except PermissionError:
                raise PayloadUnavailable(
                    f"{what} cannot be read from local:{root} by this process (permission "
                    "denied): give it read access to the store"
                ) from None
            except OSError as e:  # an I/O error may pass: the task is tried again
                raise RuntimeError(f"{what}: reading local:{root} failed ({e.strerror})") from None
            if hashlib.sha256(data).hexdigest() == found[3]:
                try:
                    return Payload.FromString(data)
                except DecodeError:
                    pass  # bytes of the right hash that are no payload: not ours either
            altered.append(f"local:{root}")
        if altered:
            raise PayloadUnavailable(
                f"{what} in {', '.join(altered)} does not match its hash: it was altered "
                "after it was stored, and is not used; restore it from a backup"
            )
        stores = ", ".join(f"local:{r}" for r in (self.root, *self.also))
        raise PayloadUnavailable(
            f"{what} is not in the payload store ({stores}): it was deleted, swept, or "
            f"stored where this process does not read; {SAME_STORE}"
        )

    def _store_one(self, folder: str, owner: Owner | None, payload: Payload) -> StorageDriverClaim:
        data = payload.SerializeToString()
        key = f"{folder}/{hashlib.sha256(data).hexdigest()}"
        path = self.root / key
        try:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                if owner is not None and not (path.parent / OWNER_FILE).exists():
                    _write(path.parent / OWNER_FILE, json.dumps(owner._asdict()).encode())
                _write(path, data)
        except OSError as e:
            why = e.strerror or type(e).__name__
            log.warning("payload store %s: cannot store a payload at %s (%s)", self, key, why)
            return StorageDriverClaim(claim_data={"key": key, UNSTORED: why})
        return StorageDriverClaim(claim_data={"key": key})

    def workflows(self) -> list[tuple[str, str | None, Path]]:
        """(namespace, workflow id, folder) of every workflow with stored payloads here.
        The id is None for a folder that does not say which workflow it holds (a long
        id's hashed name without its `.workflow` file, or with one that does not match)."""
        if not self.root.is_dir():
            return []
        return [
            (*_identified(ns, wf), wf)
            for ns in self.root.iterdir()
            if ns.is_dir()
            for wf in ns.iterdir()
            if wf.is_dir()
        ]


def _write(path: Path, data: bytes) -> None:
    # Whole or not at all: a reader never sees half a payload.
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _identified(ns: Path, wf: Path) -> tuple[str, str | None]:
    """A folder's namespace and workflow: as its `.workflow` file records them, if they
    are the ones its name encodes; else as its name says, unless that is a hash."""
    recorded: Any = None
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads((wf / OWNER_FILE).read_text())
    if isinstance(recorded, dict):
        namespace, workflow_id = recorded.get("namespace"), recorded.get("workflow_id")
        named = isinstance(namespace, str) and isinstance(workflow_id, str)
        owner = Owner(str(namespace), str(workflow_id))
        if named and _folder(owner) == f"{ns.name}/{wf.name}":
            return owner
    namespace = unquote(ns.name)
    if _HASHED.match(wf.name) or _HASHED.match(ns.name):
        return namespace, None
    return namespace, unquote(wf.name)


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
            if _s3_code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        def read() -> bytes:
            body: bytes = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        return await asyncio.to_thread(read)

    async def listed_bytes(self, *, bucket: str, prefix: str) -> int:
        """The bytes of the objects under `prefix` (`size_of`)."""

        def listed() -> int:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            return sum(o["Size"] for page in pages for o in page.get("Contents", ()))

        return await asyncio.to_thread(listed)

    async def delete_listed(self, *, bucket: str, prefix: str) -> int:
        """Delete the objects under `prefix` (`delete_stored`); how many there were."""

        def delete() -> int:
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            deleted = 0
            for page in pages:
                # A page lists at most 1,000 keys: what one delete_objects request takes.
                if keys := [{"Key": o["Key"]} for o in page.get("Contents", ())]:
                    self._s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                    deleted += len(keys)
            return deleted

        return await asyncio.to_thread(delete)

    def describe(self) -> Mapping[str, str]:
        return {"region": str(self._s3.meta.region_name), "endpoint": self._s3.meta.endpoint_url}


def _s3_code(e: BaseException) -> str:
    """The S3 error code of a botocore ClientError (empty for anything else)."""
    response = getattr(e, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class S3Store(_OwnedDriver):
    """Payloads in S3: stored by Temporal's S3 driver in `bucket` under the workflow they
    belong to, read from it and the buckets `also` names, each read checked first. With
    no client, a stand-in: every reference to S3 is one this process cannot read."""

    def __init__(
        self, client: S3StorageDriverClient | None, bucket: str | None, also: Sequence[str] = ()
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.buckets = tuple(dict.fromkeys([*([bucket] if bucket else []), *also]))

    def __str__(self) -> str:
        return ", ".join(f"s3://{b}" for b in self.buckets) or "no S3 bucket"

    def name(self) -> str:
        return S3_DRIVER

    def type(self) -> str:
        return S3_DRIVER

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        if self.client is None or self.bucket is None:
            raise StorageConfigError("this process stores in no S3 bucket")  # never selected
        owner = self.owner or _target_owner(context)
        # The key names the namespace and workflow, what a reader checks; no type or run
        # (`null`), so that a reader knows when a long id's key leaves the workflow out.
        target = (
            StorageDriverWorkflowInfo(namespace=owner.namespace, id=owner.workflow_id)
            if owner is not None
            else context.target
        )
        try:
            return await S3StorageDriver(self.client, self.bucket).store(
                StorageDriverStoreContext(target=target), payloads
            )
        except Exception as e:  # noqa: BLE001 - recorded in the reference, see the docstring
            why = _clip(" ".join(str(e.__cause__ or e).split()), MAX_REASON)
            log.warning("payload store %s: cannot store payloads (%s)", self, why)
            return [
                StorageDriverClaim(
                    claim_data={
                        "bucket": self.bucket,
                        "hash_value": hashlib.sha256(p.SerializeToString()).hexdigest(),
                        UNSTORED: why,
                    }
                )
                for p in payloads
            ]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        with _ending_if_stuck(self.owner):
            return list(await asyncio.gather(*(self._read_checked(c.claim_data) for c in claims)))

    async def _read_checked(self, claim: Mapping[str, str]) -> Payload:
        bucket, key = claim.get("bucket", ""), claim.get("key", "")
        digest = claim.get("hash_value", "")
        what = f"stored payload sha256:{digest[:16]}"
        if UNSTORED in claim:
            raise _unstored(what, f"s3://{bucket}", claim[UNSTORED])
        if bucket not in self.buckets or self.client is None:
            raise PayloadUnavailable(
                f"{what} is in S3 bucket {_clip(bucket)!r}, which this process does not read "
                f"(it reads {self}): set {STORE_ENV}=s3://BUCKET or {READ_ENV}=s3://BUCKET; "
                f"{SAME_STORE}"
            )
        found = _S3_KEY.match(key)
        if (
            not found
            or claim.get("hash_algorithm") != "sha256"
            or found[5] != digest
            or any(s is not None and _dots(s) for s in found.groups())
        ):
            raise PayloadUnavailable(
                f"a reference names {_clip(key)!r} in s3://{bucket}, which is no payload's "
                "place in that store: refused"
            )
        if self.owner is not None and not _s3_owned(found[1], found[3], self.owner):
            raise self._refused(key)
        try:
            data = await self.client.get_object(bucket=bucket, key=key)
        except Exception as e:
            code = _s3_code(e)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise PayloadUnavailable(
                    f"{what} is not in s3://{bucket}: it expired, was deleted, or was stored "
                    f"where this process does not read; {SAME_STORE}"
                ) from None
            if code in ("AccessDenied", "403", "NoSuchBucket", "InvalidAccessKeyId"):
                raise PayloadUnavailable(
                    f"{what} cannot be read from s3://{bucket} by this process ({code}): give "
                    "it the bucket's AWS credentials and read access"
                ) from None
            raise  # throttled, unreachable: the task is tried again
        if hashlib.sha256(data).hexdigest() != digest:
            raise PayloadUnavailable(
                f"{what} in s3://{bucket} does not match its hash: it was altered after it "
                "was stored, and is not used; restore it from a backup"
            )
        try:
            return Payload.FromString(data)
        except DecodeError:
            raise PayloadUnavailable(f"{what} in s3://{bucket} is not a payload") from None


def _s3_owned(namespace: str, workflow: str | None, owner: Owner) -> bool:
    """A key's namespace and workflow (as Temporal's S3 driver encodes them) are the
    owner's; a key without the workflow only when the owner's would be too long."""
    if namespace != _s3_encoded(owner.namespace):
        return False
    if workflow is not None:
        return workflow == _s3_encoded(owner.workflow_id)
    full = f"v0/ns/{namespace}/wt/null/wi/{_s3_encoded(owner.workflow_id)}/ri/null/d/sha256/"
    return len(full.encode()) + 64 > _S3_MAX_KEY


def _s3_encoded(text: str) -> str:
    """As Temporal's S3 driver puts a name in a key (`_percent_encode` there)."""
    return quote(text, safe="!-_.*'()").replace("~", "%7E") or "null"


def s3_driver(bucket: str, s3: Any = None, also: Sequence[str] = ()) -> S3Store:
    """Payloads in `bucket` (which must exist), read from the buckets `also` names too,
    with a boto3 client made from the environment's AWS settings unless `s3` is given."""
    if s3 is None:
        try:
            boto3 = importlib.import_module("boto3")
        except ImportError:
            raise StorageConfigError(
                f"a payload store in S3 (s3://{bucket or ', '.join(also)}) needs boto3: "
                "pip install 'durable-agent[aws]'"
            ) from None
        s3 = boto3.client("s3")
    return S3Store(Boto3S3Client(s3), bucket or None, also)


def _target_owner(context: StorageDriverStoreContext) -> Owner | None:
    """The workflow the SDK stores a payload for, when no serialization context says."""
    target = context.target
    if isinstance(target, StorageDriverWorkflowInfo) and target.id:
        return Owner(target.namespace, target.id)
    return None


def _folder(owner: Owner | None) -> str:
    """`<namespace>/<workflow id>`, each a segment of its own (`_` for no workflow)."""
    if owner is None:
        return "_/_"
    return f"{_segment(owner.namespace or '_')}/{_segment(owner.workflow_id or '_')}"


def _segment(text: str) -> str:
    """A name as one folder name: percent-encoded (a long one: `h-` and its hash), and
    never `.`, `..` or a hashed name's look-alike, so that no two names share a folder."""
    quoted = quote(text, safe="").replace("~", "%7E")
    if len(quoted) > 200:
        return "h-" + hashlib.sha256(text.encode()).hexdigest()
    if _dots(quoted) or _HASHED.match(quoted):
        return f"%{ord(quoted[0]):02X}{quoted[1:]}"
    return quoted


def _dots(segment: str) -> bool:
    return set(segment) == {"."}


def _payload_of(workflow_segment: str, digest: str) -> str:
    shown = workflow_segment if _HASHED.match(workflow_segment) else unquote(workflow_segment)
    return f"stored payload sha256:{digest[:16]} of workflow {_clip(shown)}"


def _unstored(what: str, store: str, why: str) -> PayloadUnavailable:
    return PayloadUnavailable(
        f"{what.replace('stored payload', 'payload')} was never stored: {store} refused it "
        f"({_clip(' '.join(why.split()), MAX_REASON)}) when it was written; make the store "
        "writable (space, permissions) for the processes that write it"
    )


def _clip(text: str, limit: int = 120) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _NoSuchDriver(StorageDriver):
    """What a reference to a driver this process does not have reads as."""

    def __init__(self, driver: str, owner: Owner | None) -> None:
        self.driver, self.owner = driver, owner

    def name(self) -> str:
        return self.driver

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        raise StorageConfigError(f"no payload store {self.driver!r} here")  # never selected

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        with _ending_if_stuck(self.owner):
            raise PayloadUnavailable(
                f"a payload stored by {_clip(self.driver)!r}, a payload store this process "
                f"does not have (it has {FOLDER_DRIVER} and {S3_DRIVER}); {SAME_STORE}"
            )


@dataclass(frozen=True)
class _Storing:
    """`ExternalStorage.driver_selector`: the driver that stores (None: none does)."""

    driver: StorageDriver | None

    def __call__(
        self, context: StorageDriverSelectContext, payload: Payload
    ) -> StorageDriver | None:
        return self.driver


@dataclass(frozen=True)
class PayloadStore(ExternalStorage, WithSerializationContext):
    """Temporal's External Storage, over the stores this process reads, storing in one of
    them (or none). The SDK hands it each payload's serialization context
    (`with_context`): its drivers then store and read as that workflow's."""

    owner: Owner | None = None

    @property
    def storing(self) -> StorageDriver | None:
        """The driver payloads over the threshold go to (None: storing is off)."""
        selector = self.driver_selector
        return selector.driver if isinstance(selector, _Storing) else None

    def _get_driver_by_name(self, name: str) -> StorageDriver:
        """A reference names its driver: one this process does not have is a payload it
        cannot have, said as such (the SDK's own error would fail the task forever)."""
        try:
            return super()._get_driver_by_name(name)
        except ValueError:
            return _NoSuchDriver(name, self.owner)

    def with_context(self, context: SerializationContext) -> PayloadStore:
        owner = owner_of(context)
        if owner == self.owner:
            return self
        drivers = [d.owned_by(owner) if isinstance(d, _OwnedDriver) else d for d in self.drivers]
        storing = self.storing
        chosen = next((b for a, b in zip(self.drivers, drivers, strict=True) if a is storing), None)
        return dataclasses.replace(
            self, drivers=drivers, driver_selector=_Storing(chosen), owner=owner
        )


STUCK_AFTER_S = 20.0
"""How long a worker that met an unreadable payload of a turn watches for the turn's
workflow task to fail again, before it lets the turn be."""
_ending_with: dict[str, list[Client]] = {}
"""The clients of this process's workers, by namespace (`ending_stuck_turns`)."""
_watched: dict[Owner, asyncio.Task[None]] = {}


@contextlib.asynccontextmanager
async def ending_stuck_turns(client: Client) -> AsyncIterator[None]:
    """While a worker of `client` runs: a turn whose workflow task it cannot run for want
    of a payload is ended (see `_end_if_stuck`)."""
    clients = _ending_with.setdefault(client.namespace, [])
    clients.append(client)
    try:
        yield
    finally:
        clients.remove(client)


@contextlib.contextmanager
def _ending_if_stuck(owner: Owner | None) -> Iterator[None]:
    """`PayloadUnavailable` goes on as it is; a worker's process also watches the turn."""
    try:
        yield
    except PayloadUnavailable as e:
        clients = _ending_with.get(owner.namespace, []) if owner is not None else []
        if owner is not None and clients and owner not in _watched:
            task = asyncio.get_running_loop().create_task(
                _end_if_stuck(clients[-1], owner.workflow_id, e.message)
            )
            _watched[owner] = task
            task.add_done_callback(lambda _: _watched.pop(owner, None))
        raise


async def _end_if_stuck(client: Client, workflow_id: str, line: str) -> None:
    """Terminate the turn, `line` its reason, if its workflow task fails again within
    `STUCK_AFTER_S`: a replay that met an unreadable payload (see the module docstring).
    A turn the SDK failed, or one whose activity met the payload, has no task failing.
    A closed workflow's payload met in a task is a child's, read by its parent: the
    parent is the one watched."""
    deadline = time.monotonic() + STUCK_AFTER_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError:
            return
        if described.status != WorkflowExecutionStatus.RUNNING:
            if not described.parent_id:
                return
            workflow_id = described.parent_id
            continue
        if described.raw_description.pending_workflow_task.attempt >= 2:
            log.warning("turn %s: its workflow task cannot read its record: ending it", workflow_id)
            with contextlib.suppress(RPCError):  # ended meanwhile
                await client.get_workflow_handle(workflow_id).terminate(
                    reason=f"{PayloadUnavailable.__name__}: {line}"
                )
            return


async def first_unreadable(client: Client, workflow_id: str) -> str | None:
    """The line of the first payload of the workflow's (latest run's) history that `client`
    cannot have from its stores; None when it can have them all. For a turn no worker can
    replay (its query fails): what to tell whoever asked."""
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        try:
            await inline_stored(client, workflow_id, [copy.deepcopy(event)])
        except PayloadUnavailable as e:
            return e.message
    return None


async def inline_stored(client: Client, workflow_id: str, events: Iterable[HistoryEvent]) -> None:
    """Each reference to a stored payload in `events` (of the workflow's history) replaced
    by the payload, as stored (encrypted, with encryption on): a history that replays with
    no store beside it, as one recorded with the store off. `PayloadUnavailable` for one
    `client` cannot have from its stores."""
    storage = client.data_converter.external_storage
    if not isinstance(storage, PayloadStore):
        return
    readers: dict[str, dict[str, StorageDriver]] = {}
    for event in events:
        # A child's input and result are the child's payloads (see the module docstring).
        owner = _child_of(event) or workflow_id
        if owner not in readers:
            bound = storage.with_context(WorkflowSerializationContext(client.namespace, owner))
            readers[owner] = {d.name(): d for d in bound.drivers}
        for payload in _payloads_in(event):
            reference = _reference(payload)
            if reference is None:
                continue
            name = reference.driver_name
            driver = readers[owner].get(name) or _NoSuchDriver(name, Owner(client.namespace, owner))
            claim = StorageDriverClaim(claim_data=dict(reference.claim_data))
            [stored] = await driver.retrieve(StorageDriverRetrieveContext(), [claim])
            payload.CopyFrom(stored)


def _child_of(event: HistoryEvent) -> str | None:
    """The child workflow an event of its parent's history carries payloads of."""
    kind = event.WhichOneof("attributes") or ""
    if kind == "start_child_workflow_execution_initiated_event_attributes":
        return str(event.start_child_workflow_execution_initiated_event_attributes.workflow_id)
    if kind.startswith("child_workflow_execution_"):
        return str(getattr(event, kind).workflow_execution.workflow_id) or None
    return None


def _payloads_in(message: Message) -> Iterator[Payload]:
    """Every payload in a message (a history event), wherever it sits."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = value.values()
        elif field.is_repeated:
            values = value
        else:
            values = [value]
        for item in values:
            if isinstance(item, Message):
                yield from _payloads_in(item)


_REFERENCE_TYPE = ExternalStorageReference.DESCRIPTOR.full_name.encode()


def _reference(payload: Payload) -> ExternalStorageReference | None:
    """The reference a payload is, if it is one (as Temporal's External Storage writes it)."""
    if payload.metadata.get("messageType") != _REFERENCE_TYPE:
        return None
    try:
        return json_format.Parse(payload.data, ExternalStorageReference())
    except json_format.ParseError:
        return None


@dataclass(frozen=True)
class StoreConverter(DataConverter):
    """The SDK's data converter over a `PayloadStore`, with what that costs kept down: it
    binds the store (and itself) to a context at every payload of every workflow task,
    and to where a payload would be stored. A binding is made once (a turn's tasks ask
    for its workflow's, and each activity's, again and again; where to store is bound
    once a run), and a store that stores nothing is not bound to where it would store.
    (Bindings keyed by the workflow alone, which its activities would share, held some
    10 MB more in a 1,000-step turn's worker: not kept.)"""

    _contexts: dict[SerializationContext, DataConverter] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _targets: dict[StorageDriverStoreContext, DataConverter] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def with_context(self, context: SerializationContext) -> StoreConverter:
        bound = self._contexts.pop(context, None) or super().with_context(context)
        self._contexts[context] = bound  # the most recent last
        if len(self._contexts) > MAX_BOUND:
            del self._contexts[next(iter(self._contexts))]  # the least recent
        return bound  # type: ignore[return-value]

    def _with_store_context(self, store_ctx: StorageDriverStoreContext) -> DataConverter:
        storage = self.external_storage
        if isinstance(storage, PayloadStore) and storage.storing is None:
            return self
        try:
            hash(store_ctx)
        except TypeError:  # a target that cannot be a key
            return super()._with_store_context(store_ctx)
        # The same target (a run, for its every task and activity): the same binding.
        bound = self._targets.pop(store_ctx, None) or super()._with_store_context(store_ctx)
        self._targets[store_ctx] = bound  # the most recent last
        if len(self._targets) > MAX_BOUND:
            del self._targets[next(iter(self._targets))]  # the least recent
        return bound


def external_storage(environ: Mapping[str, str] | None = None) -> PayloadStore:
    """The stores this process reads, storing where AGENT_PAYLOAD_STORE says."""
    env = os.environ if environ is None else environ
    spec = env.get(STORE_ENV, "").strip() or DEFAULT_STORE
    threshold = _threshold(env.get(THRESHOLD_ENV, "").strip())
    reads = [r.strip() for r in env.get(READ_ENV, "").split(",") if r.strip()]
    folders: list[Path] = [state_dir(env) / "payloads"]
    buckets: list[str] = []
    for given in reads:
        if given.startswith("s3://") and _BUCKET.match(given.removeprefix("s3://").rstrip("/")):
            buckets.append(given.removeprefix("s3://").rstrip("/"))
        elif given.startswith("local:") and given != "local:":
            folders.append(Path(given.removeprefix("local:")))
        else:
            raise StorageConfigError(
                f"{READ_ENV}: {given!r}: name stores as local:/a/folder or s3://a-bucket, "
                "comma-separated"
            )
    bucket = spec.removeprefix("s3://").rstrip("/")
    storing: StorageDriver | None = None
    if spec == "off":
        pass
    elif spec == "local":
        storing = FolderStorageDriver(folders[0], folders[1:])
    elif spec.startswith("local:") and spec != "local:":
        storing = FolderStorageDriver(spec.removeprefix("local:"), folders)
    elif spec.startswith("s3://") and _BUCKET.match(bucket):
        storing = s3_driver(bucket, also=buckets)
    else:
        raise StorageConfigError(
            f"{STORE_ENV}={spec!r}: use local, local:/a/folder, s3://a-bucket or off"
        )
    folder = storing if isinstance(storing, FolderStorageDriver) else None
    s3 = storing if isinstance(storing, S3Store) else None
    drivers: list[StorageDriver] = [
        folder or FolderStorageDriver(folders[0], folders[1:]),
        s3 or (s3_driver("", also=buckets) if buckets else S3Store(None, None)),
    ]
    return PayloadStore(
        drivers=drivers,
        driver_selector=_Storing(storing),
        payload_size_threshold=threshold if storing is not None else NEVER,
    )


MAX_RUNS_COUNTED = 1000
"""Runs of a turn `size_of` walks back through, at most (two requests each)."""


class TurnSize(NamedTuple):
    """What a turn costs the server and the payload store."""

    history_bytes: int
    """Its history, all runs together, as the server counts it."""
    events: int
    runs: int
    """Its runs: one, and one more each time it continued as new."""
    stored_bytes: int | None
    """Its payloads in the stores this process reads (None: unknown, a bucket that would
    not list them)."""
    stores: str
    """Those stores, for the person."""

    def line(self) -> str:
        """`history: 1.2 MB in 3 runs (4,210 events); payload store: 8.4 MB (local:/…)`."""
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        stored = "unknown" if self.stored_bytes is None else _bytes(self.stored_bytes)
        return (
            f"history: {_bytes(self.history_bytes)} in {runs} ({self.events:,} events); "
            f"payload store: {stored} ({self.stores})"
        )


def _bytes(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


async def size_of(client: Client, workflow_id: str) -> TurnSize:
    """The history of every run of the workflow (latest first, back through each run it
    continued from), and its payloads' bytes in the stores `client` reads."""
    history = events = runs = 0
    run_id: str | None = None
    while runs < MAX_RUNS_COUNTED:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        info = (await handle.describe()).raw_description.workflow_execution_info
        history += info.history_size_bytes
        events += info.history_length
        runs += 1
        run_id = None
        async for first in handle.fetch_history_events(page_size=1):
            started = first.workflow_execution_started_event_attributes
            run_id = started.continued_execution_run_id or None
            break
        if run_id is None:
            break
    storage = client.data_converter.external_storage
    owner = Owner(client.namespace, workflow_id)
    if not isinstance(storage, PayloadStore):
        return TurnSize(history, events, runs, None, "none")
    stored = await _stored_bytes(storage, owner)
    where = ", ".join(
        str(d) for d in storage.drivers if not (isinstance(d, S3Store) and not d.buckets)
    )
    return TurnSize(history, events, runs, stored, where)


async def delete_stored(storage: ExternalStorage | None, owner: Owner) -> int:
    """Delete the owner's stored payloads from every store this process reads (its
    folder in each; in S3, the objects under its key prefix in each bucket it knows):
    how many payloads went. A payload whose S3 key leaves the workflow out (an id too
    long to name in 1,024 bytes) cannot be told from others' and stays."""
    deleted = 0
    drivers = storage.drivers if isinstance(storage, PayloadStore) else []
    for driver in drivers:
        if isinstance(driver, FolderStorageDriver):
            for root in dict.fromkeys((driver.root, *driver.also)):
                folder = root / _folder(owner)
                with contextlib.suppress(FileNotFoundError):  # none stored there
                    deleted += sum(1 for p in folder.iterdir() if not p.name.startswith("."))
                    shutil.rmtree(folder)
        elif isinstance(driver, S3Store) and isinstance(driver.client, Boto3S3Client):
            for bucket in driver.buckets:
                deleted += await driver.client.delete_listed(
                    bucket=bucket, prefix=_s3_prefix(owner)
                )
    return deleted


def _s3_prefix(owner: Owner) -> str:
    """The key prefix of the owner's payloads in S3 (as `S3Store.store` writes them)."""
    return (
        f"v0/ns/{_s3_encoded(owner.namespace)}/wt/null/wi/"
        f"{_s3_encoded(owner.workflow_id)}/ri/null/d/sha256/"
    )


async def _stored_bytes(storage: PayloadStore, owner: Owner) -> int | None:
    """The bytes of the owner's payloads in the stores this process reads (None: a bucket
    would not list them, for want of the right, say)."""
    total = 0
    for driver in storage.drivers:
        if isinstance(driver, FolderStorageDriver):
            for root in (driver.root, *driver.also):
                with contextlib.suppress(OSError):  # none stored there (yet)
                    total += sum(
                        p.stat().st_size
                        for p in (root / _folder(owner)).iterdir()
                        if p.is_file() and not p.name.startswith(".")
                    )
        elif isinstance(driver, S3Store) and isinstance(driver.client, Boto3S3Client):
            for bucket in driver.buckets:
                try:
                    total += await driver.client.listed_bytes(
                        bucket=bucket, prefix=_s3_prefix(owner)
                    )
                except Exception:  # noqa: BLE001 - no list right, unreachable: unknown
                    return None
    return total


def storing_lines(
    storage: ExternalStorage | None, *, named_server: bool, environ: Mapping[str, str] | None = None
) -> list[str]:
    """What a worker says of its store when it starts: where it stores; on a named server,
    with the default store, that workers on other machines need one they all reach."""
    storing = storage.storing if isinstance(storage, PayloadStore) else None
    if storing is None or storage is None:
        return [f"payload store: off ({STORE_ENV}=off): every payload inline in the history"]
    lines = [f"payload store: {storing} (payloads from {storage.payload_size_threshold:,} bytes)"]
    env = os.environ if environ is None else environ
    if named_server and not env.get(STORE_ENV, "").strip():
        lines.append(
            f"note: the payload store is this machine's folder ({STORE_ENV} unset); workers "
            f"on other machines need one they all reach: {STORE_ENV}=local:/shared/folder "
            "or s3://BUCKET, the same for every process"
        )
    return lines


def storing_folder(storage: ExternalStorage | None) -> FolderStorageDriver | None:
    """The folder a process stores payloads in (None: it stores none, or in S3)."""
    storing = storage.storing if isinstance(storage, PayloadStore) else None
    return storing if isinstance(storing, FolderStorageDriver) else None


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
    gone from the server), whose parents (if any) are too; the ids of the workflows
    whose payloads went. A folder that does not say which workflow it holds stays."""
    now = now or datetime.now(timezone.utc)
    if not await _this_servers(client, driver):
        return []
    gone = []
    for namespace, workflow_id, folder in driver.workflows():
        if namespace != client.namespace:
            continue
        if workflow_id is None:
            log.warning("payload store: %s holds the payloads of no known workflow; kept", folder)
            continue
        newest = max((p.stat().st_mtime for p in folder.iterdir()), default=0.0)
        if time.time() - newest < retention.total_seconds():
            continue  # written to within the retention: its workflow cannot have closed before
        closed, parent = await _closed(client, workflow_id, retention, now)
        if closed and parent:
            # A child's result is read again whenever its parent replays.
            closed, _ = await _closed(client, parent, retention, now)
        if closed:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(workflow_id)
    return gone


async def _this_servers(client: Client, driver: FolderStorageDriver) -> bool:
    """Whether the folder holds this server's payloads: the first sweep records the
    server's cluster id in it. With the store on by default, processes of one state
    folder may talk to two servers (the embedded one, one named): a workflow of the other
    server's is unknown to this one, which must not read as deleted long ago."""
    cluster = await identify(client)
    recorded = driver.root / SERVER_FILE
    with contextlib.suppress(FileNotFoundError):
        if (known := recorded.read_text().strip()) != cluster:
            log.warning(
                "payload store %s: holds the payloads of another Temporal server's workflows "
                "(cluster %s, this one is %s): not swept; give each server a store of its "
                "own (a server whose database is gone for good: delete %s, and the store's "
                "folders of its workflows with it)",
                driver,
                _clip(known),
                cluster,
                recorded,
            )
            return False
        return True
    driver.root.mkdir(parents=True, exist_ok=True)
    _write(recorded, cluster.encode())
    return True


async def _closed(
    client: Client, workflow_id: str, retention: timedelta, now: datetime
) -> tuple[bool, str]:
    """Whether the workflow closed more than `retention` ago (or is gone), and its parent."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return True, ""  # the server has deleted its history already
    closed = (
        described.status is not None
        and described.status != WorkflowExecutionStatus.RUNNING
        and described.close_time is not None
        and now - described.close_time > retention
    )
    return closed, described.parent_id or ""


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
    driver = storing_folder(external_storage())
    if driver is None:
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
