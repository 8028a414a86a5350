"""Encryption at rest: a payload codec hook, and AES-GCM with rotating keys.

A store opened with ``EventStore(..., payload_codec=codec)`` passes every payload it writes
(records, whose events, context values and memoized results are in their payloads; inbox
entries; snapshots) through ``codec.encode`` and every payload it reads back through
``codec.decode``, as Temporal's PayloadCodec does for a workflow's payloads. The other
columns (seqs, runs, kinds, steps, times, the runs' rows) stay as they are, readable with
plain SQLite tools; an encrypted payload is still JSON text, an envelope::

    {"enc": "aes-gcm", "kid": "2026-12", "data": "<base64 of nonce + ciphertext + tag>"}

``kid`` names the key it was sealed with, so keys rotate: a codec encrypts with its current
key and decrypts with any key it holds. Payloads written without a codec stay plain text and
read back as they are, so encryption can be switched on for an existing store. A store
opened without a codec reads envelopes back as they are (tools show them as "encrypted (key
id)"); a wrong key is :class:`DecryptionError`, never garbage.

The envelope is made here, once, for any codec: a codec only turns bytes into bytes.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import orjson

from ._errors import EventStoreError, LogCorruptedError
from ._records import Commit, Record, Snapshot, StoredRecord

__all__ = [
    "AesGcmCodec",
    "DecryptionError",
    "EncryptedPayloadError",
    "PayloadCodec",
    "PayloadCodecError",
    "Sealer",
    "add_key",
    "encrypted_error",
    "load_key_file",
    "sealed_key_id",
]

# Every envelope starts with these characters (the key order is the one written below):
# a payload that does not is plain text, written before encryption or without a codec.
_PREFIX: Final = '{"enc":"'
# Key ids and codec names go into the envelope unescaped: a short token.
_TOKEN: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NONCE_BYTES: Final = 12  # AES-GCM's standard nonce, random per payload
_KEY_SIZES: Final = (16, 24, 32)


class PayloadCodecError(EventStoreError):
    """A payload could not be encrypted or decrypted, or a key file is unusable."""


class DecryptionError(PayloadCodecError):
    """An encrypted payload does not decrypt: a key id the codec does not hold, a wrong key
    under a known id, or a payload altered since it was written."""

    def __init__(self, msg: str, *, key_id: str | None = None) -> None:
        super().__init__(msg)
        self.key_id = key_id


class EncryptedPayloadError(PayloadCodecError):
    """An encrypted payload was read by code that needs its value, from a store opened
    without a payload codec (the key)."""

    def __init__(self, msg: str, *, key_id: str) -> None:
        super().__init__(msg)
        self.key_id = key_id


@runtime_checkable
class PayloadCodec(Protocol):
    """Encrypts payload bytes and decrypts them again (Temporal's PayloadCodec, for one
    payload at a time).

    ``name`` goes into each envelope (``"aes-gcm"``); ``key_id`` is the id of the key new
    payloads are encrypted with. ``context`` is bound to the ciphertext (AES-GCM's
    associated data): a payload moved to another kind of record no longer decrypts.
    """

    @property
    def name(self) -> str: ...

    @property
    def key_id(self) -> str: ...

    def encode(self, data: bytes, *, context: bytes) -> bytes:
        """``data`` encrypted with the key ``key_id`` names."""
        ...

    def decode(self, data: bytes, *, key_id: str, context: bytes) -> bytes:
        """``data`` decrypted with the key ``key_id`` names.

        :raises DecryptionError: no such key, or ``data`` does not decrypt with it.
        """
        ...


class AesGcmCodec:
    """AES-GCM (from ``cryptography``, the ``encryption`` extra) over a ring of keys.

    ``keys`` maps key ids to 16, 24 or 32 byte keys; ``current`` is the id new payloads are
    encrypted with (default: the last one given). Rotate by adding a key and making it
    current: what older keys sealed still decrypts while their keys are in the ring.
    """

    name: Final = "aes-gcm"

    def __init__(self, keys: Mapping[str, bytes], current: str | None = None) -> None:
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # pragma: no cover - the extra is installed in the tests
            msg = (
                "AES-GCM needs the cryptography package:"
                " pip install 'durable-workflows[encryption]'"
            )
            raise PayloadCodecError(msg) from None
        if not keys:
            msg = "an AES-GCM codec needs at least one key"
            raise PayloadCodecError(msg)
        self._invalid: type[Exception] = InvalidTag
        self._ciphers: dict[str, Any] = {}
        for kid, key in keys.items():
            _check_token(kid, "key id")
            if len(key) not in _KEY_SIZES:
                msg = f"key {kid!r} is {len(key)} bytes: AES keys are 16, 24 or 32 bytes"
                raise PayloadCodecError(msg)
            self._ciphers[kid] = AESGCM(bytes(key))
        kid = list(keys)[-1] if current is None else current
        if kid not in self._ciphers:
            msg = f"the current key {kid!r} is not among the keys given ({_ids(keys)})"
            raise PayloadCodecError(msg)
        self._key_id = kid
        self._current = self._ciphers[kid]

    def __repr__(self) -> str:
        return f"AesGcmCodec(key_id={self._key_id!r}, keys={_ids(self._ciphers)})"

    @property
    def key_id(self) -> str:
        """The id of the key new payloads are encrypted with."""
        return self._key_id

    @property
    def key_ids(self) -> list[str]:
        """Every key id this codec decrypts."""
        return list(self._ciphers)

    @classmethod
    def from_key_file(cls, path: str | os.PathLike[str]) -> AesGcmCodec:
        """The codec of a key file (see :func:`load_key_file`)."""
        return load_key_file(path)

    def encode(self, data: bytes, *, context: bytes) -> bytes:
        nonce = os.urandom(_NONCE_BYTES)
        return nonce + bytes(self._current.encrypt(nonce, data, context))

    def decode(self, data: bytes, *, key_id: str, context: bytes) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            msg = (
                f"it is encrypted with key id {key_id!r}, which the key file does not hold"
                f" (it holds {_ids(self._ciphers)})"
            )
            raise DecryptionError(msg, key_id=key_id)
        try:
            return bytes(cipher.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], context))
        except self._invalid:
            msg = (
                f"it does not decrypt with key {key_id!r}: the key file holds another key"
                " under that id, or the payload was altered"
            )
            raise DecryptionError(msg, key_id=key_id) from None


def _ids(keys: Mapping[str, Any]) -> str:
    return ", ".join(repr(k) for k in keys) or "none"


def _check_token(text: str, what: str) -> None:
    if not isinstance(text, str) or not _TOKEN.fullmatch(text):
        msg = f"{what} {text!r} must be 1 to 64 letters, digits or '_.:-'"
        raise PayloadCodecError(msg)


# --------------------------------------------------------------------------- key files


def load_key_file(path: str | os.PathLike[str]) -> AesGcmCodec:
    """The AES-GCM codec of a key file: JSON ``{"current": ID, "keys": {ID: base64 key}}``.

    :raises PayloadCodecError: the file is missing, not such JSON, or a key is unusable.
    """
    where = os.fspath(path)
    try:
        text = Path(where).read_bytes()
    except OSError as exc:
        msg = f"key file {where}: cannot read it ({exc.strerror or exc})"
        raise PayloadCodecError(msg) from None
    try:
        data = orjson.loads(text)
        keys_b64 = data["keys"]
        keys = {str(k): base64.b64decode(v, validate=True) for k, v in keys_b64.items()}
        current = data.get("current")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, binascii.Error):
        msg = (
            f'key file {where}: not a key file (JSON with "current" and "keys": an id'
            " to base64 key map; `workflow keygen FILE` writes one)"
        )
        raise PayloadCodecError(msg) from None
    try:
        return AesGcmCodec(keys, None if current is None else str(current))
    except PayloadCodecError as exc:
        msg = f"key file {where}: {exc}"
        raise PayloadCodecError(msg) from None


def add_key(path: str | os.PathLike[str], key_id: str | None = None) -> str:
    """Adds a new random 256-bit key to a key file (creating it, readable by its owner
    only) and makes it current; returns its id. Older keys stay, to decrypt what they
    sealed.

    :raises PayloadCodecError: the id is taken or malformed, or the file is not a key file.
    """
    where = Path(path)
    data: dict[str, Any] = {"current": None, "keys": {}}
    if where.exists():
        load_key_file(where)  # refuses a file that is not one before it is rewritten
        data = orjson.loads(where.read_bytes())
    keys: dict[str, str] = data["keys"]
    kid = key_id if key_id is not None else f"k{len(keys) + 1}"
    while key_id is None and kid in keys:
        kid += "-"
    _check_token(kid, "key id")
    if kid in keys:
        msg = f"key file {where}: it already holds a key {kid!r}"
        raise PayloadCodecError(msg)
    keys[kid] = base64.b64encode(os.urandom(32)).decode()
    data["current"] = kid
    body = orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"
    fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    return kid


# --------------------------------------------------------------------------- envelopes


def sealed_key_id(text: str) -> str | None:
    """The key id of an encrypted payload, None for a plain one (cheap for plain ones)."""
    if not text.startswith(_PREFIX):
        return None
    env = _envelope(text)
    return None if env is None else env[1]


def _envelope(text: str) -> tuple[str, str, str] | None:
    """(codec name, key id, base64 data) of an envelope, None for any other JSON."""
    try:
        env = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(env, dict) or set(env) != {"enc", "kid", "data"}:
        return None
    name, kid, data = env["enc"], env["kid"], env["data"]
    if not (isinstance(name, str) and isinstance(kid, str) and isinstance(data, str)):
        return None
    return name, kid, data


class Sealer:
    """Puts a store's payloads into envelopes with a codec, and takes them out again."""

    def __init__(self, codec: PayloadCodec) -> None:
        _check_token(codec.name, "codec name")
        _check_token(codec.key_id, "key id")
        self.codec = codec
        self._head = f'{{"enc":"{codec.name}","kid":"{codec.key_id}","data":"'

    def seal(self, text: str, context: str) -> str:
        """``text`` as an envelope, encrypted with the codec's current key."""
        data = self.codec.encode(text.encode(), context=context.encode())
        return self._head + binascii.b2a_base64(data, newline=False).decode("ascii") + '"}'

    def open(self, text: str, context: str, where: str) -> str:
        """The plain text of a payload: an envelope decrypted, a plain payload as it is.

        :raises DecryptionError: naming ``where`` (which record, snapshot or inbox entry).
        """
        if not text.startswith(_PREFIX):
            return text
        env = _envelope(text)
        if env is None:
            return text
        name, kid, data = env
        if name != self.codec.name:
            msg = f"{where} is encrypted by {name!r}, the store's codec is {self.codec.name!r}"
            raise DecryptionError(msg, key_id=kid)
        try:
            raw = base64.b64decode(data, validate=True)
        except binascii.Error:
            msg = f"{where} is an envelope whose data is not base64; the store may be damaged"
            raise LogCorruptedError(msg) from None
        try:
            plain = self.codec.decode(raw, key_id=kid, context=context.encode())
        except DecryptionError as exc:
            msg = f"{where}: {exc}"
            raise DecryptionError(msg, key_id=kid) from None
        return plain.decode()

    # ----------------------------------------------------------------- the store's payloads

    def commit(self, commit: Commit) -> Commit:
        """A copy of ``commit`` whose payloads (records and snapshot) are sealed; the
        caller's commit and records are left as they are (an executor folds its own)."""
        records = [Record(r.kind, r.step, self.seal(r.payload, r.kind)) for r in commit.records]
        snap = commit.snapshot
        if snap is not None:
            snap = snap if isinstance(snap, Snapshot) else Snapshot(*snap)
            snap = snap._replace(data=self.seal(snap.data, "snapshot"))
        return Commit(
            commit.run_id,
            records,
            epoch=commit.epoch,
            create=commit.create,
            status=commit.status,
            check=commit.check,
            on_written=commit.on_written,
            inbox_taken=commit.inbox_taken,
            snapshot=snap,
            seq=commit.seq,
            ts=commit.ts,
        )

    def records(self, it: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
        """Records read back with their payloads opened."""
        for r in it:
            if r.payload.startswith(_PREFIX):
                where = f"record seq {r.seq} ({r.kind}) of run {r.run_id!r}"
                r = r._replace(payload=self.open(r.payload, r.kind, where))
            yield r

    def snapshot(self, snap: Snapshot | None, run_id: str) -> Snapshot | None:
        """A snapshot read back with its data opened."""
        if snap is None or not snap.data.startswith(_PREFIX):
            return snap
        where = f"the snapshot of run {run_id!r} at seq {snap.seq}"
        return snap._replace(data=self.open(snap.data, "snapshot", where))

    def inbox(self, payload: str, run_id: str, entry: int) -> str:
        """An inbox entry's payload read back, opened."""
        return self.open(payload, "inbox", f"inbox entry {entry} of run {run_id!r}")


def encrypted_error(r: StoredRecord) -> EncryptedPayloadError | None:
    """The error to raise for a record whose value is needed, when it is encrypted and the
    store was opened without the key; None when it is not encrypted."""
    kid = sealed_key_id(r.payload)
    if kid is None:
        return None
    msg = (
        f"record seq {r.seq} ({r.kind}) of run {r.run_id!r} is encrypted (key id {kid!r}):"
        " open the store with its key (payload_codec=, or --key-file / WORKFLOW_KEY_FILE)"
    )
    return EncryptedPayloadError(msg, key_id=kid)
