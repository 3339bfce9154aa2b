"""`delayq tokens create|list|revoke`: API token management on AdminService."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from delayq._convert import parse_duration_text
from delayq.admin import ROLES, AdminClient, TokenInfo

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Adds the `tokens` command to the CLI's subparsers."""
    t = sub.add_parser("tokens", help="API tokens (server with --auth): create, list, revoke")
    tsub = t.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    c = tsub.add_parser("create", help="make a token; prints its secret once")
    c.add_argument("token_namespace", metavar="NAMESPACE", help="namespace, or '*' for every one")
    c.add_argument(
        "-r",
        "--role",
        dest="roles",
        action="append",
        choices=sorted(ROLES),
        required=True,
        help="repeat for several roles",
    )
    c.add_argument("--ttl", type=parse_duration_text, help="expires after this long, e.g. 30d")
    c.add_argument("--description", default="", help="who or what the token is for")
    c.add_argument("--json", action="store_true", help="print token and details as JSON")
    ls = tsub.add_parser("list", help="list tokens (never their secrets)")
    ls.add_argument("token_namespace", metavar="NAMESPACE", nargs="?", default="")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    r = tsub.add_parser("revoke", help="revoke a token by its id")
    r.add_argument("token_id", metavar="TOKEN_ID")


def _info_json(info: TokenInfo) -> dict[str, Any]:
    return {
        "token_id": info.token_id,
        "namespace": info.namespace,
        "roles": list(info.roles),
        "description": info.description,
        "create_time": info.create_time.isoformat() if info.create_time else None,
        "expire_time": info.expire_time.isoformat() if info.expire_time else None,
    }


def run(args: argparse.Namespace, out: TextIO) -> int:
    with AdminClient(args.target, token=args.token, timeout=args.timeout) as admin:
        if args.tokens_command == "create":
            token, info = admin.create_token(
                args.token_namespace, args.roles, ttl=args.ttl, description=args.description
            )
            if args.json:
                out.write(json.dumps({"token": token, **_info_json(info)}) + "\n")
            else:
                out.write(token + "\n")
            return 0
        if args.tokens_command == "list":
            infos = admin.list_tokens(args.token_namespace)
            if args.json:
                for info in infos:
                    out.write(json.dumps(_info_json(info)) + "\n")
                return 0
            out.write(f"{'TOKEN_ID':<16}  {'NAMESPACE':<16}  {'ROLES':<28}  EXPIRES  DESCRIPTION\n")
            for info in infos:
                expires = info.expire_time.isoformat() if info.expire_time else "never"
                out.write(
                    f"{info.token_id:<16}  {info.namespace:<16}  {','.join(info.roles):<28}  "
                    f"{expires}  {info.description}\n"
                )
            return 0
        admin.revoke_token(args.token_id)
        out.write(f"revoked {args.token_id}\n")
        return 0
