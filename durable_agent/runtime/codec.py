"""Payload encryption: AES-GCM over every payload a client or worker hands to Temporal.

The server stores each turn's input, every activity's arguments and result, and
every failure message in its history, and keeps them for the namespace's
retention. With a key configured, client and worker encrypt each payload before
it leaves the process, so the server (and whoever reads its database or its
API) holds only ciphertext; the Web UI shows the text through the codec server
(`python -m durable_agent.runtime.codec_server`), which holds the same keys.

    AGENT_ENCRYPTION_KEY        a key ring: `[ID:]BASE64` entries, comma-separated
    AGENT_ENCRYPTION_KEY_FILE   the same in a file (one entry per line, `#` comments)

Each key is 16, 24 or 32 random bytes, base64-encoded (`openssl rand -base64 32`).
The first key encrypts; every key decrypts. Each payload names the key that
encrypted it, so keys rotate without a flag day: put the new key first and
keep the old one after it until no open workflow or retained history needs it.
A key without `ID:` is named by a fingerprint of its bytes.

An encrypted payload: metadata `encoding: binary/encrypted` and
`encryption-key-id: <id>`; data = 12-byte random nonce, then the AES-GCM
ciphertext (with its tag) of the original payload, serialized; the key id is
the associated data, so relabelling a payload to another key fails to decrypt.
Payloads without that encoding pass through `decode` unchanged, so histories
written before encryption was switched on stay readable.

Not encrypted, by Temporal's design: workflow ids, activity and workflow type
names, task queues, search attributes, and timings. Failure messages and stack
traces are, because the converter moves them into an encoded payload.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import SchemaSerializer
from pydantic_core.core_schema import any_schema
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadCodec,
)

from durable_agent.runtime.storage import StoreConverter, external_storage
from durable_agent.types import LEAN

ENCODING = b"binary/encrypted"
KEY_ID_KEY = "encryption-key-id"
NONCE_BYTES = 12
KEY_SIZES = (16, 24, 32)
KEY_ENV = "AGENT_ENCRYPTION_KEY"
KEY_FILE_ENV = "AGENT_ENCRYPTION_KEY_FILE"
CODEC_ENDPOINT_ENV = "AGENT_CODEC_ENDPOINT"
DEFAULT_CODEC_PORT = 8888
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class EncryptionConfigError(ValueError):
    """The encryption settings cannot work; the message says what to change."""


class DecryptionError(ValueError):
    """A payload cannot be decrypted with the keys at hand."""


@dataclass(frozen=True)
class KeyRing:
    """Keys by id, in order: the first encrypts, all decrypt."""

    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if not self.keys:
            raise EncryptionConfigError("the encryption key ring is empty")

    @property
    def current_id(self) -> str:
        return next(iter(self.keys))

    def __repr__(self) -> str:  # never print key bytes
        return f"KeyRing(ids={list(self.keys)})"

    @classmethod
    def parse(cls, text: str, source: str = KEY_ENV) -> KeyRing:
        """Parse `[ID:]BASE64` entries separated by commas or newlines."""
        keys: dict[str, bytes] = {}
        entries = [e.strip() for line in text.splitlines() for e in line.split(",")]
        entries = [e for e in entries if e and not e.startswith("#")]
        for n, entry in enumerate(entries, 1):
            key_id, _, encoded = entry.rpartition(":")
            try:
                key = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise EncryptionConfigError(
                    f"{source}: key {n} is not base64; generate one with `openssl rand -base64 32`"
                ) from None
            if len(key) not in KEY_SIZES:
                raise EncryptionConfigError(
                    f"{source}: key {n} is {len(key)} bytes; AES-GCM needs 16, 24 or 32 "
                    "(`openssl rand -base64 32` makes a 32-byte key)"
                )
            key_id = key_id or fingerprint(key)
            if not _KEY_ID.fullmatch(key_id):
                raise EncryptionConfigError(
                    f"{source}: key id {key_id!r} may only use letters, digits, '.', '_', '-' "
                    "(at most 64)"
                )
            if key_id in keys:
                raise EncryptionConfigError(f"{source}: key id {key_id!r} appears twice")
            keys[key_id] = key
        if not keys:
            raise EncryptionConfigError(f"{source} holds no key")
        return cls(keys)


def fingerprint(key: bytes) -> str:
    """A key's default id: 12 hex digits of its SHA-256 (not enough to guess the key)."""
    return "k-" + hashlib.sha256(key).hexdigest()[:12]


def key_ring_from_env(environ: Mapping[str, str] | None = None) -> KeyRing | None:
    """The key ring from AGENT_ENCRYPTION_KEY or AGENT_ENCRYPTION_KEY_FILE; None when
    neither is set (encryption off)."""
    env = os.environ if environ is None else environ
    inline, path = env.get(KEY_ENV, "").strip(), env.get(KEY_FILE_ENV, "").strip()
    if inline and path:
        raise EncryptionConfigError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set; set one of them")
    if inline:
        return KeyRing.parse(inline, KEY_ENV)
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise EncryptionConfigError(
                f"{KEY_FILE_ENV}={path}: cannot read the key file ({e.strerror})"
            ) from None
        return KeyRing.parse(text, f"{KEY_FILE_ENV}={path}")
    return None


class EncryptionCodec(PayloadCodec):
    """AES-GCM payload codec over a key ring (see the module docstring for the format)."""

    def __init__(self, ring: KeyRing) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise EncryptionConfigError(
                f"{KEY_ENV} is set, but the `cryptography` package is missing: "
                "pip install -e '.[crypto]'"
            ) from None
        self.ring = ring
        self._ciphers = {key_id: AESGCM(key) for key_id, key in ring.keys.items()}

    def encrypt(self, payload: Payload) -> Payload:
        key_id = self.ring.current_id
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, payload.SerializeToString(), key_id.encode())
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_KEY: key_id.encode()},
            data=nonce + sealed,
        )

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID_KEY, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(
                f"payload encrypted with key {key_id!r}, which is not in the key ring "
                f"(it has {', '.join(self.ring.keys)}): add that key after the current one "
                f"in {KEY_ENV} or {KEY_FILE_ENV}"
            )
        from cryptography.exceptions import InvalidTag
        from google.protobuf.message import DecodeError

        try:
            plain = cipher.decrypt(
                payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:], key_id.encode()
            )
        except InvalidTag:
            raise DecryptionError(
                f"payload encrypted with key {key_id!r} does not decrypt: the key with "
                "that id is not the one that encrypted it, or the payload was altered"
            ) from None
        except ValueError:  # shorter than a nonce and a tag, say
            raise DecryptionError("payload is not an encrypted payload (malformed)") from None
        try:
            return Payload.FromString(plain)
        except DecodeError:
            raise DecryptionError("payload decrypts to something that is not a payload") from None

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]


_LEAN = {LEAN: True}


class LeanJSONPayloadConverter(PydanticJSONPlainPayloadConverter):
    """Pydantic's JSON (the SDK's converter) without the fields that hold their
    default: `"error": null`, `"calls": []` and the like fill a turn's history once per
    call and per step, and a reader gets them back from the model's defaults. A field's
    default is part of what is stored, then: change one only under a new field name,
    or workflows in flight read the new default where the old one was meant."""

    _serializer = SchemaSerializer(any_schema())

    def to_payload(self, value: Any) -> Payload | None:
        data = self._serializer.to_json(value, exclude_defaults=True, context=_LEAN)
        return Payload(metadata={"encoding": self.encoding.encode()}, data=data)


class LeanPayloadConverter(CompositePayloadConverter):
    """The SDK's converters, with `LeanJSONPayloadConverter` for JSON. They hold no
    state, so every instance shares them: the SDK makes a converter afresh for each
    payload it converts with a context (a workflow's, an activity's)."""

    _converters = tuple(
        LeanJSONPayloadConverter() if isinstance(c, JSONPlainPayloadConverter) else c
        for c in DefaultPayloadConverter.default_encoding_payload_converters
    )

    def __init__(self) -> None:
        super().__init__(*self._converters)


LEAN_DATA_CONVERTER = DataConverter(payload_converter_class=LeanPayloadConverter)


def data_converter(environ: Mapping[str, str] | None = None) -> DataConverter:
    """The project's converter (pydantic), encrypting when a key is configured, with
    large payloads in the store AGENT_PAYLOAD_STORE names (`runtime/storage.py`):
    encrypted before they are stored. Whether or not it stores, it reads the payloads a
    history refers to, from every store this process knows of.

    With encryption on, failure messages and stack traces move into an encoded
    payload too: a tool's error text can quote what the customer wrote."""
    ring = key_ring_from_env(environ)
    converter = StoreConverter(
        payload_converter_class=LeanPayloadConverter, external_storage=external_storage(environ)
    )
    if ring is None:
        return converter
    return dataclasses.replace(
        converter,
        payload_codec=EncryptionCodec(ring),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def codec_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """Where a Web UI finds the codec server (AGENT_CODEC_ENDPOINT, default
    http://localhost:8888), when encryption is on; None when it is off."""
    env = os.environ if environ is None else environ
    if not (env.get(KEY_ENV, "").strip() or env.get(KEY_FILE_ENV, "").strip()):
        return None
    default = f"http://localhost:{DEFAULT_CODEC_PORT}"
    return (env.get(CODEC_ENDPOINT_ENV, "").strip() or default).rstrip("/")
