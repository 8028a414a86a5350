"""``--key-file``: the key ring every command opens the store with (encryption at rest).

Given to the command group (``workflow --key-file KEYS history DB RUN``) or as the
``WORKFLOW_KEY_FILE`` environment variable, it is the key file (``workflow keygen``) whose
keys decrypt the store's payloads and whose current key encrypts what a command writes.
Without it, read commands still list an encrypted run's seqs, kinds and steps and show
each payload as "encrypted (key id)"; what needs values says which key it needs.
"""

from __future__ import annotations

from typing import Any, Final

import click

from eventstore import EventStore, PayloadCodec, load_key_file, sealed_key_id

__all__ = ["KEY_FILE_ENV", "cli_codec", "encrypted_text", "refuse_plain_write", "set_key_file"]

KEY_FILE_ENV: Final = "WORKFLOW_KEY_FILE"
_META: Final = "workflow.payload_codec"


def set_key_file(ctx: click.Context, path: str | None) -> None:
    """Loads the key file named to the group (at once: a bad file is said before the
    command runs) for every store the command opens."""
    ctx.meta[_META] = None if path is None else load_key_file(path)


def cli_codec() -> PayloadCodec | None:
    """The codec of the command running now (None: no key file given)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    codec: Any = ctx.meta.get(_META)
    return codec if isinstance(codec, PayloadCodec) else None


def encrypted_text(payload: str) -> str | None:
    """How a listing shows a payload it could not decrypt: "encrypted (key id)"."""
    kid = sealed_key_id(payload)
    return None if kid is None else f"encrypted ({kid})"


def refuse_plain_write(store: EventStore, run_id: str) -> None:
    """Refuses to write a payload in the clear to a run whose log is encrypted, when the
    command was given no key file: it would sit there unencrypted.

    :raises click.ClickException: naming the key id the run's payloads are sealed with.
    """
    if store.payload_codec is not None:
        return
    first = next(iter(store.records(run_id, upto=store.run(run_id).first_seq)), None)
    kid = None if first is None else sealed_key_id(first.payload)
    if kid is not None:
        msg = (
            f"run {run_id!r} is encrypted (key id {kid!r}): pass --key-file (or set"
            f" {KEY_FILE_ENV}) so that what is written to it is encrypted too"
        )
        raise click.ClickException(msg)
