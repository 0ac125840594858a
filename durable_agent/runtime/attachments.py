"""Attachments in and out of the payload store (`durable_agent/attachments.py`).

A caller stores a file's bytes as a payload of the turn that will read them, through
its client's data converter: encrypted when encryption is on, then written to the
payload store, which hands back a reference. The model activity reads it back through
its worker's converter, as that turn's payload: the store's own checks hold (the key
is the turn's, the payload matches its hash), and the bytes are checked against the
attachment's hash too. Neither way do the bytes enter a workflow.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence

from google.protobuf.message import DecodeError
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import WorkflowSerializationContext
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.attachments import Attachment, File
from durable_agent.errors import AttachmentRefused, PayloadUnavailable
from durable_agent.rewind import FORK_MEMO, Origin
from durable_agent.runtime.storage import STORE_ENV, _reference

MAX_INLINE = 4096
"""An attachment the store did not take (storing is off, or it is under the threshold)
rides in the turn's input only up to this size."""


async def store(client: Client, workflow_id: str, files: Sequence[File]) -> list[Attachment]:
    """The files, stored as payloads of the workflow `workflow_id` (the turn that reads
    them, or the conversation whose turn will), as the attachments that refer to them."""
    context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id)
    converter = client.data_converter.with_context(context)
    stored = []
    for f in files:
        [payload] = await converter.encode([f.data])
        if _reference(payload) is None and len(f.data) > MAX_INLINE:
            raise AttachmentRefused(
                f"{f.name!r} cannot be attached: the payload store is off here ({STORE_ENV}=off), "
                f"and a file over {MAX_INLINE:,} bytes never travels inside a turn; "
                f"set {STORE_ENV} (see docs/attachments.md)"
            )
        ref = base64.b64encode(payload.SerializeToString()).decode("ascii")
        stored.append(
            Attachment(
                name=f.name,
                content_type=f.content_type,
                size=len(f.data),
                sha256=f.sha256,
                ref=ref,
                owner=workflow_id,
            )
        )
    return stored


async def load(attachments: Iterable[Attachment]) -> dict[str, bytes]:
    """In an activity of a turn: the bytes of its attachments, by their sha256, read from
    the payload store as that turn's payloads. `PayloadUnavailable` for one that cannot
    be had, or whose bytes are not the ones attached."""
    turn = activity.info().workflow_id or ""
    found: dict[str, bytes] = {}
    for a in attachments:
        if a.sha256 not in found:
            found[a.sha256] = await read(activity.client(), turn, a)
    return found


async def read(client: Client, turn: str, a: Attachment) -> bytes:
    """The bytes of the attachment `a` of the turn `turn`, read from the payload store by
    its reference, through `client`'s converter (the model activity's, or a front end's
    that serves the file to the turn's owner). `PayloadUnavailable` for one that is
    another lineage's, cannot be had, or whose bytes are not the ones attached."""
    owner = a.owner or turn
    if owner != turn and not await _descends_from(client, turn, owner):
        raise PayloadUnavailable(
            f"attachment {a.name!r} is workflow {owner}'s, which is not turn {turn}'s "
            "conversation: refused (a turn reads its own files, its conversation's, and "
            "those of the turn it was forked from)"
        )
    context = WorkflowSerializationContext(namespace=client.namespace, workflow_id=owner)
    converter = client.data_converter.with_context(context)
    try:
        payload = Payload.FromString(base64.b64decode(a.ref, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        raise PayloadUnavailable(f"attachment {a.name!r}: its reference is no payload's") from None
    [data] = await converter.decode([payload], [bytes])
    if not isinstance(data, bytes) or hashlib.sha256(data).hexdigest() != a.sha256:
        raise PayloadUnavailable(
            f"attachment {a.name!r}: the stored bytes are not the ones attached: refused"
        )
    return data


_ups: dict[str, str | None] = {}
"""Each workflow's one step up, as the server recorded it (a fact for good): a
conversation's turn its conversation, a fork the turn it was forked from."""
MAX_UPS = 1024
MAX_HOPS = 16
"""How far up a turn's lineage is looked: forks of forks of a conversation's turn."""


async def _descends_from(client: Client, turn: str, owner: str) -> bool:
    """Whether the workflow `owner` is up the turn's lineage: its conversation (the
    workflow that started it), or a turn it was forked from, theirs in turn. The server's
    records (the parent it started under, the fork's memo, set when the fork started)
    say so, never the turn's input: a message naming another conversation's files is
    not read."""
    at = turn
    for _ in range(MAX_HOPS):
        up = await _up(client, at)
        if up is None:
            return False
        if up == owner:
            return True
        at = up
    return False


async def _up(client: Client, workflow_id: str) -> str | None:
    if workflow_id not in _ups:
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            return None  # gone (retention): its files are not had through it
        up = described.parent_id
        if not up:
            try:
                origin = await described.memo_value(FORK_MEMO, None)
                up = Origin.model_validate(origin).parent if origin is not None else None
            except (KeyError, ValueError, TypeError):
                up = None
        if len(_ups) >= MAX_UPS:
            _ups.pop(next(iter(_ups)))
        _ups[workflow_id] = up
    return _ups[workflow_id]
