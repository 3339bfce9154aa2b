"""Client certificate identities (mTLS) mapped to a namespace and roles, from a JSON file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from delayq_server.auth.principal import ALL_NAMESPACES, ROLES, Principal
from delayq_server.validation import NAME_RE


class CertRoles:
    """identity (certificate CN or a SAN entry) -> Principal.

    The file is a JSON object, e.g.
    ``{"worker-a.example.com": {"namespace": "tenant-a", "roles": ["consume"]}}``.
    """

    def __init__(self, mapping: dict[str, Principal]) -> None:
        self._map = mapping

    @classmethod
    def load(cls, path: str) -> CertRoles:
        raw: Any = json.loads(Path(path).read_text("utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: want a JSON object of identity -> {{namespace, roles}}")
        out: dict[str, Principal] = {}
        for ident, spec in raw.items():
            ns = spec.get("namespace", "") if isinstance(spec, dict) else ""
            roles = spec.get("roles", []) if isinstance(spec, dict) else []
            if ns != ALL_NAMESPACES and not NAME_RE.match(ns):
                raise ValueError(f"{path}: {ident!r}: namespace {ns!r} is not a valid name or '*'")
            if not roles or any(r not in ROLES for r in roles):
                raise ValueError(f"{path}: {ident!r}: roles must be a non-empty subset of {ROLES}")
            out[ident] = Principal(ns, frozenset(roles), f"cert:{ident}")
        return cls(out)

    def lookup(self, auth_context: Mapping[str, Iterable[bytes]]) -> Principal | None:
        """The principal of the first mapped identity in the peer's certificate."""
        for field in ("x509_common_name", "x509_subject_alternative_name"):
            for value in auth_context.get(field, []):
                p = self._map.get(value.decode(errors="replace"))
                if p is not None:
                    return p
        return None
