"""The first admin token, made at first start so no existing token is needed (README "Auth")."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

from delayq_server.auth import principal as pr
from delayq_server.auth import tokens
from delayq_server.store.tokens import TokenRecord, TokenStore

log = logging.getLogger(__name__)


async def _store(store: TokenStore, token: str, token_id: str, description: str) -> None:
    now = await store.time_ms()
    await store.create(
        TokenRecord(
            token_id=token_id,
            secret_hash=tokens.digest(token),
            namespace=pr.ALL_NAMESPACES,
            roles=tuple(pr.ROLES),
            description=description,
            created_ms=now,
            expires_ms=0,
        )
    )


def _read_or_write(path: Path) -> str:
    if path.exists():
        return path.read_text("utf-8").strip()
    token, _ = tokens.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("wrote a new admin token to %s", path)
    return token


async def ensure_admin(store: TokenStore, token_file: str | None) -> None:
    """With a token file: its token is an admin of every namespace (the file is
    written, mode 0600, when missing; every replica may share it). Without one:
    the first replica ever to start with auth on prints a fresh admin token once."""
    if token_file is not None:
        path = Path(token_file)
        token = await asyncio.to_thread(_read_or_write, path)
        token_id = tokens.token_id_of(token)
        if token_id is None:
            raise SystemExit(f"{path}: not a delayq token (want dq_<16 hex>_<43 chars>)")
        rec = await store.get(token_id)
        if rec is None or rec.secret_hash != tokens.digest(token):
            await _store(store, token, token_id, f"bootstrap ({path.name})")
        await store.claim_bootstrap()
        return
    if not await store.claim_bootstrap():
        return
    token, token_id = tokens.generate()
    await _store(store, token, token_id, "bootstrap (printed at first start)")
    # Shown once, on stderr, never logged again: keep it, or revoke it after
    # making the tokens you need (`delayq tokens create`).
    print(f"delayq: first start with auth on: admin token (shown once): {token}", file=sys.stderr)
