"""``casebox steward serve``: the root daemon (docs/steward-protocol.md, docs/operations.md)."""

from __future__ import annotations

import argparse
import os

from executor.cli import config as configuration
from executor.cli.sessions import steward_for
from journal.errors import Refused


def _serve(args: argparse.Namespace) -> int:
    from steward import server

    config = configuration.load(args.config).overridden(socket=args.socket, state_root=args.state_root)
    directory = os.path.dirname(config.socket)
    if args.socket is not None and not os.path.isdir(directory):
        # Only the configured socket's directory is ever made (/run/casebox without systemd's RuntimeDirectory).
        raise Refused(args.socket, f"cannot be created: its directory {directory} does not exist, and casebox makes no directory a flag names")
    bounds = server.Bounds(
        idle_seconds=config.idle_seconds, max_connections=config.max_connections,
        max_connections_per_uid=config.max_connections_per_uid, stop_seconds=config.stop_seconds,
    )
    steward = steward_for(config)
    try:
        return server.serve(
            steward, socket_path=config.socket, client_uids=config.client_uids, socket_group=config.socket_group,
            bounds=bounds,
        )
    finally:
        steward.close()


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "steward", help="the root daemon that runs sessions (root)", description="The steward daemon (docs/steward-protocol.md)."
    )
    commands = group.add_subparsers(dest="steward_command", metavar="COMMAND")
    commands.required = True
    serve = commands.add_parser(
        "serve",
        help="serve steward sessions on a Unix socket until SIGTERM",
        description="As root: listen on the socket (mode 0660 with the configured socket_group, by default casebox, "
        "when that group exists, else 0600, root only), authenticate each client with SO_PEERCRED against client_uids, and serve one session per "
        "connection: stages, sandboxes, outputs, cleanup proof, retirement into sealed tombstones. Connections are "
        "capped per uid (max_connections_per_uid) and in total (max_connections, root's not counted); a client "
        "beyond a cap is refused at once. A client that disconnects before CLOSE, or sends nothing for "
        "idle_seconds, has its session cleaned up and retired as UNVERIFIED. Refusals are logged on stderr. Sends "
        "READY=1 to NOTIFY_SOCKET when set. SIGTERM or SIGINT stops accepting, ends running ops and retires every "
        "open session as UNVERIFIED (SHUTDOWN): exit 0 when all were retired within stop_seconds, else 1, with "
        "each one left named in the log.",
    )
    serve.add_argument("--socket", metavar="PATH", help="the socket to listen on, in a directory that exists (default: configuration)")
    serve.add_argument("--state-root", metavar="DIR", help="the state root (default: configuration)")
    serve.set_defaults(handler=_serve)
