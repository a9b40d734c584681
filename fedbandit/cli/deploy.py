"""The commands of a Flower deployment: ``superlink``, ``supernode``, ``register-node`` and
``keys`` set one up, ``status`` and ``pull`` follow a run submitted with ``run --detach``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedbandit.flower.certs import add_cli as add_keys_command
from fedbandit.flower.processes import (
    DEFAULT_SUPERLINK_PORT,
    DEFAULT_SUPERNODE_PORT,
    SUPERLINK_LAUNCHER,
    ServerTls,
    flower_environment,
    parse_client_range,
    superlink_command,
    supernode_command,
)
from fedbandit.flower.run_log import AskAgainError
from fedbandit.flower.run_record import SERVER_RESULTS_VARIABLE
from fedbandit.flower.submission import Submission

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the runner and
# result folders (each loads pandas).


#: Exit status of ``pull`` while the detached run goes on, and of ``status`` and ``pull`` when
#: the SuperLink cannot answer now (sysexits' EX_TEMPFAIL: try again).
ASK_AGAIN = 75


def _reach(args: argparse.Namespace) -> dict[str, object]:
    """How ``status`` and ``pull`` reach the SuperLink, where given on the command line."""
    return {
        "superlink": args.superlink,
        "root_certificates": args.root_certificates,
        "insecure": getattr(args, "insecure", False) or None,
    }


def _cmd_status(args: argparse.Namespace) -> int:
    from fedbandit.runs.detached import detached_status

    try:
        heading, lines = detached_status(args.out, _reach(args))
    except AskAgainError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return ASK_AGAIN
    print(heading)
    width = max((len(label) for label, _ in lines), default=0)
    for label, state in lines:
        print(f"  {label:<{width}}  {state}")
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from fedbandit.results.files import read_json
    from fedbandit.runs.detached import pull_detached
    from fedbandit.runs.report import summary_table

    try:
        manifest = pull_detached(args.out, reach=_reach(args), run_id=args.run_id)
    except AskAgainError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return ASK_AGAIN
    for why in manifest["broken"]:
        print(f"fedbandit: warning: skipped result files: {why}", file=sys.stderr)
    arrived, wanted = manifest["arrived"], manifest["wanted"]
    if manifest.get("rebuilt_now"):
        print(
            f"fedbandit: rebuilt {args.out} from the log of Flower run "
            f"{manifest['detached']['flower_run']}"
        )
    print(f"fedbandit: pulled {manifest['pulled']} new runs; {arrived} of {wanted} have arrived")
    if manifest["status"] == "complete":
        if not args.quiet:
            print(summary_table(read_json(args.out / "summary.json")))
        print(f"results: {args.out} (plots in its plots/ folder)")
        return 0
    if arrived == wanted:  # the folder also lacks runs the Flower run did not hold
        print(
            f"fedbandit: every run of the detached run is here; the folder lacks "
            f"{len(manifest['missing_runs'])} runs it did not hold (rerun with --out {args.out} "
            "to add them)",
            file=sys.stderr,
        )
        return 0
    if "stopped" in manifest:
        print(
            f"fedbandit: error: the detached run ended without every seed: {manifest['stopped']}; "
            f"rerun with --out {args.out} to run the missing ones",
            file=sys.stderr,
        )
        return 3
    print(
        f"fedbandit: the run goes on ({manifest['detached']['flower_status']}); "
        f"`fedbandit pull {args.out}` again later",
        file=sys.stderr,
    )
    return ASK_AGAIN


def _cmd_superlink(args: argparse.Namespace) -> int:
    tls = ServerTls.from_dir(args.tls_dir) if args.tls_dir else None
    command = superlink_command(
        args.state_dir, args.host, args.port, tls, args.insecure, args.node_auth, args.in_memory
    )
    extra = {}
    if args.results_dir is not None:  # the ServerApp, a child of the SuperLink, inherits it
        extra[SERVER_RESULTS_VARIABLE] = str(args.results_dir.resolve())
    if not args.print_command:  # Flower's SuperLink, with a SuperExec that stops its ServerApps
        command = [*SUPERLINK_LAUNCHER, *command[1:]]
    return _exec_flower(command, args.state_dir, args.print_command, extra)


def _cmd_supernode(args: argparse.Namespace) -> int:
    clients = parse_client_range(args.clients)
    state_dir = args.state_dir or Path("flower-state") / f"supernode-{args.clients}"
    command = supernode_command(
        args.superlink,
        clients,
        args.port,
        args.root_certificates,
        args.insecure,
        args.auth_key,
        state_dir if args.persist else None,
        fast_poll=args.poll_interval > 0,
        warm=args.poll_interval > 0 and not args.cold,
    )
    extra = {"FEDBANDIT_SUPERNODE_POLL": str(args.poll_interval)} if args.poll_interval > 0 else {}
    return _exec_flower(command, state_dir, args.print_command, extra)


def _cmd_register(args: argparse.Namespace) -> int:
    submission = Submission(
        args.superlink, args.state_dir, root_certificates=args.root_certificates
    )
    for key in args.public_keys:
        node_id = submission.register_node(key, key.stem)
        print(f"registered {key} as SuperNode {node_id}")
    return 0


def _exec_flower(
    command: list[str], state_dir: Path, print_only: bool, extra_env: dict[str, str] | None = None
) -> int:
    """Run a Flower command with fedbandit's safe environment (replacing this process)."""
    import shlex

    env = {**flower_environment(state_dir), **(extra_env or {})}
    if print_only:
        keys = [
            "FLWR_HOME",
            "FLWR_TELEMETRY_ENABLED",
            "FLWR_DISABLE_UPDATE_CHECK",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL",
            *(extra_env or {}),
        ]
        print(" ".join(f"{k}={shlex.quote(env[k])}" for k in keys), shlex.join(command))
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    print(f"fedbandit: {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, env)
    return 1  # not reached


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The deployment commands: ``status`` and ``pull`` (a detached run), ``superlink``,
    ``supernode``, ``register-node`` and ``keys``."""
    _add_detached_commands(sub)
    _add_flower_commands(sub)
    add_keys_command(sub)


def _add_detached_commands(sub: argparse._SubParsersAction) -> None:
    """``status`` and ``pull``."""
    status = sub.add_parser("status", help="the state of each seed of a detached run")
    pull = sub.add_parser(
        "pull", help="fetch the finished seeds of a detached run (again: only the new ones)"
    )
    for command in (status, pull):
        command.add_argument(
            "out",
            type=Path,
            help="the folder of `fedbandit run ... --detach` (pull --run-id: one to rebuild)",
        )
        command.add_argument(
            "--superlink",
            help="HOST:PORT of the SuperLink from here (default: as recorded)",
        )
        command.add_argument(
            "--root-certificates", type=Path, help="the SuperLink's CA certificate on this machine"
        )
    status.set_defaults(func=_cmd_status)
    pull.add_argument("--quiet", action="store_true", help="no table")
    pull.add_argument(
        "--run-id",
        type=int,
        metavar="ID",
        help="rebuild OUT from this Flower run's log alone (a lost folder): give --superlink "
        "and --root-certificates or --insecure",
    )
    pull.add_argument(
        "--insecure", action="store_true", help="plain HTTP to the SuperLink (with --run-id)"
    )
    pull.set_defaults(func=_cmd_pull)


def _add_flower_commands(sub: argparse._SubParsersAction) -> None:
    """``superlink``, ``supernode`` and ``register-node``."""
    link = sub.add_parser(
        "superlink", help="start a Flower SuperLink (the server side of a deployment)"
    )
    link.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    link.add_argument("--port", type=int, default=DEFAULT_SUPERLINK_PORT)
    link.add_argument(
        "--state-dir",
        type=Path,
        default=Path("flower-state/superlink"),
        help="Flower's home and the SuperLink database (nodes survive a SuperLink restart)",
    )
    link.add_argument("--tls-dir", type=Path, help="folder with ca.crt, server.pem, server.key")
    link.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    link.add_argument(
        "--node-auth", action="store_true", help="only registered SuperNodes may join (TLS)"
    )
    link.add_argument(
        "--in-memory",
        action="store_true",
        help="keep the SuperLink state in memory: faster rounds, but a SuperLink restart forgets "
        "nodes, runs and registered keys",
    )
    link.add_argument(
        "--results-dir",
        type=Path,
        metavar="DIR",
        help="also keep a copy of every seed's files on this host, in DIR/<the driver folder's "
        "name> (the results always reach the driver through the run's log)",
    )
    link.add_argument("--print-command", action="store_true", help="print the Flower command")
    link.set_defaults(func=_cmd_superlink)

    node = sub.add_parser("supernode", help="start a Flower SuperNode serving a client range")
    node.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    node.add_argument("--clients", required=True, help="logical clients served, e.g. 0-49")
    node.add_argument(
        "--port", type=int, default=DEFAULT_SUPERNODE_PORT, help="local port (one per node)"
    )
    node.add_argument("--root-certificates", type=Path, help="CA certificate (TLS)")
    node.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    node.add_argument("--auth-key", type=Path, help="this node's private key (node auth)")
    node.add_argument("--state-dir", type=Path, help="Flower's home for this node")
    node.add_argument(
        "--persist",
        action="store_true",
        help="save client statistics under --state-dir so a restarted node resumes",
    )
    node.add_argument(
        "--poll-interval",
        type=float,
        default=0.2,
        help="seconds between polls of an idle node (Flower hard-codes 3; 0: plain Flower, "
        "which implies --cold)",
    )
    node.add_argument(
        "--cold",
        action="store_true",
        help="a new ClientApp process per message (Flower's default) instead of one warm one",
    )
    node.add_argument("--print-command", action="store_true", help="print the Flower command")
    node.set_defaults(func=_cmd_supernode)

    register = sub.add_parser("register-node", help="register SuperNode public keys (node auth)")
    register.add_argument("public_keys", nargs="+", type=Path, help="NODE.pub files")
    register.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    register.add_argument("--root-certificates", type=Path, required=True, help="CA certificate")
    register.add_argument("--state-dir", type=Path, default=Path("flower-state/cli"))
    register.set_defaults(func=_cmd_register)
