"""MCP tool lists by their hash, kept outside the turns' histories.

A turn records what each MCP server listed for it (`AgentInfo.tool_lists`) as the
sha256 of the list's canonical JSON (`list_hash`), about 80 bytes a server, not as
the list: 200 tools with their schemas weigh hundreds of kilobytes, and every turn
of the agent would record them again. The lists are kept here, one file per list,
named by its hash, in the place the payload store setting names:

    AGENT_PAYLOAD_STORE     the tool lists
    off (default), local    <AGENT_STATE_DIR>/tool-lists/ (the processes of one machine)
    local:/shared/folder    /shared/folder/tool-lists/
    s3://BUCKET             tool-lists/<hash>.json in the bucket

The worker that listed a server keeps its list here once (`keep`), as the first turn
offered it starts. A worker that needs a list it did not list itself (it started
since the server's list changed, or took a turn over after a crash) reads it by its
hash (`get`) and checks it: a copy whose content does not have that hash is refused.
Lists kept or read stay in memory too (the last `CACHE_SIZE`). A list weighs a few
hundred kilobytes at most (`durable_agent.mcp.MAX_LIST_BYTES`), is written once
however many turns offer it, and holds tool specs only (plain JSON, no customer
data). Nothing deletes them (`storage sweep` leaves them): a turn of any age can be
taken over.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import os
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from durable_agent.errors import ToolListUnavailable
from durable_agent.runtime.storage import _BUCKET, STORE_ENV, StorageConfigError
from durable_agent.settings import state_dir

log = logging.getLogger("durable_agent.tool_lists")

FOLDER = "tool-lists"
"""The lists' folder (or key prefix, in S3) in the place the store names."""
CACHE_SIZE = 256
"""Lists a worker keeps in memory, by hash, the latest used last."""
KEEP_TIMEOUT_S = 3.0
"""How long a turn's first step waits for a list to be written: past it, or on an
error, a warning, and the turn goes on (this worker serves it from memory)."""
KEEP_PAUSE_S = 60.0
"""After a write failed, how long before that list is tried again."""
_HASH = re.compile(r"[0-9a-f]{64}")

ToolList = list[dict[str, Any]]


def canonical(tools: Sequence[Mapping[str, Any]]) -> bytes:
    """A list as it is hashed and kept: JSON with sorted keys and no spaces."""
    text = json.dumps(list(tools), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode()


def list_hash(tools: Sequence[Mapping[str, Any]]) -> str:
    """The hash a turn records a list by: sha256 of its canonical JSON, in hex."""
    return hashlib.sha256(canonical(tools)).hexdigest()


class _Backend(Protocol):
    def read(self, digest: str) -> bytes | None: ...

    def write(self, digest: str, data: bytes) -> None: ...


class _Folder:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()

    def __str__(self) -> str:
        return str(self.root)

    def read(self, digest: str) -> bytes | None:
        try:
            return (self.root / f"{digest}.json").read_bytes()
        except FileNotFoundError:
            return None

    def write(self, digest: str, data: bytes) -> None:
        path = self.root / f"{digest}.json"
        if path.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        # Whole or not at all: a reader never sees half a list.
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        partial.write_bytes(data)
        os.replace(partial, path)


class _S3:
    def __init__(self, bucket: str, s3: Any = None) -> None:
        self.bucket = bucket
        self._s3 = s3

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{FOLDER}/"

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            try:
                boto3 = importlib.import_module("boto3")
            except ImportError:
                raise StorageConfigError(
                    f"{STORE_ENV}=s3://{self.bucket} needs boto3: pip install 'durable-agent[aws]'"
                ) from None
            self._s3 = boto3.client("s3")
        return self._s3

    def read(self, digest: str) -> bytes | None:
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=f"{FOLDER}/{digest}.json")
        except self.s3.exceptions.NoSuchKey:
            return None
        body: bytes = got["Body"].read()
        return body

    def write(self, digest: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=f"{FOLDER}/{digest}.json", Body=data)


class ToolListStore:
    """Tool lists by their hash: `keep` one, `get` it back (checked) anywhere the store
    is shared.

        store = ToolListStore.from_env()         # as AGENT_PAYLOAD_STORE says
        store = ToolListStore.folder("/shared/tool-lists")
    """

    def __init__(self, backend: _Backend) -> None:
        self._backend = backend
        self._cache: OrderedDict[str, ToolList] = OrderedDict()
        self._kept: set[str] = set()
        self._failed: dict[str, float] = {}
        """Lists whose write failed, and when (`time.monotonic()`)."""

    def __str__(self) -> str:
        return str(self._backend)

    @classmethod
    def folder(cls, root: Path | str) -> ToolListStore:
        return cls(_Folder(Path(root)))

    @classmethod
    def s3(cls, bucket: str, s3: Any = None) -> ToolListStore:
        """In `bucket` (which must exist), under `tool-lists/`; a boto3 client made from
        the environment's AWS settings unless `s3` is given."""
        return cls(_S3(bucket, s3))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ToolListStore:
        """Where AGENT_PAYLOAD_STORE keeps payloads, else the state folder (the table
        above); nothing is opened before the first list is kept or read."""
        env = os.environ if environ is None else environ
        spec = env.get(STORE_ENV, "").strip() or "off"
        bucket = spec.removeprefix("s3://").rstrip("/")
        if spec in ("off", "local"):
            return cls.folder(state_dir(env) / FOLDER)
        if spec.startswith("local:"):
            return cls.folder(Path(spec.removeprefix("local:")) / FOLDER)
        if spec.startswith("s3://") and _BUCKET.match(bucket):
            return cls.s3(bucket)
        raise StorageConfigError(
            f"{STORE_ENV}={spec!r}: use local, local:/a/folder, s3://a-bucket or off"
        )

    async def keep(self, digest: str, tools: Sequence[Mapping[str, Any]]) -> None:
        """`tools`, whose hash is `digest`, in the store: written once per process. A
        write that fails or takes more than `KEEP_TIMEOUT_S` is a warning, and tried
        again `KEEP_PAUSE_S` later: this worker serves the list from memory meanwhile,
        and a worker that lists the server the same way needs no copy."""
        if digest in self._kept:
            return
        failed = self._failed.get(digest)
        if failed is not None and time.monotonic() - failed < KEEP_PAUSE_S:
            return
        self._remember(digest, [dict(t) for t in tools])
        try:
            data = canonical(tools)
            await asyncio.wait_for(
                asyncio.to_thread(self._backend.write, digest, data), KEEP_TIMEOUT_S
            )
        except Exception as e:  # noqa: BLE001 - a help for other workers, not a must here
            self._failed[digest] = time.monotonic()
            log.warning(
                "tool list %s: could not keep it in %s (%s); a worker that did not list it "
                "cannot take over a turn offered it",
                digest[:12],
                self,
                f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
            )
            return
        self._failed.pop(digest, None)
        self._kept.add(digest)

    async def get(self, digest: str) -> ToolList | None:
        """The list whose hash is `digest`: from memory, else read from the store and
        checked; None if the store does not have it. ToolListUnavailable if the store's
        copy does not have that hash (it was changed or damaged)."""
        found = self._cache.get(digest)
        if found is not None:
            self._cache.move_to_end(digest)
            return found
        if not _HASH.fullmatch(digest):
            raise ToolListUnavailable(f"{digest[:80]!r} is not the hash of a tool list")
        data = await asyncio.to_thread(self._backend.read, digest)
        if data is None:
            return None
        tools = _checked(digest, data, self)
        self._remember(digest, tools)
        return tools

    def _remember(self, digest: str, tools: ToolList) -> None:
        self._cache[digest] = tools
        self._cache.move_to_end(digest)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)


def _checked(digest: str, data: bytes, store: ToolListStore) -> ToolList:
    """The list a store's copy holds, if it has hash `digest`."""
    tools: Any = None
    if hashlib.sha256(data).hexdigest() == digest:
        try:
            tools = json.loads(data)
        except ValueError:
            tools = None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ToolListUnavailable(
            f"the tool list {digest[:12]} in {store} does not have the hash it is kept "
            f"by: it was changed or damaged since it was written, and no turn is served "
            f"with it; find out what changed it, and delete {digest}.json there (a worker "
            "that starts and lists that server as it was keeps it again)"
        )
    return tools
