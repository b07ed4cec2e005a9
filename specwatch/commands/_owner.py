"""Commands that write the state store run as the user who owns it, or not at all.

The daemon (the unit's `specwatch` user) owns the state directory. `sudo specwatch baseline accept` as root
would write the SQLite file, its journal and WAL as root, and the daemon could then no longer write its own
store. So a writing command checks first, and says how to run it instead.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import sys


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def not_owner_message(state_dir: str, argv: list[str], euid: int | None = None) -> str:
    """Why the current user must not write `state_dir`, with the command to run instead; "" when it may (it
    owns the directory, or the directory does not exist yet and the command itself reports or creates it)."""
    try:
        owner = os.stat(state_dir).st_uid
    except OSError:
        return ""
    me = os.geteuid() if euid is None else euid
    if me == owner:
        return ""
    command = shlex.join(["specwatch", *argv])
    return (
        f"{state_dir} belongs to user {_name(owner)}, and this command would write its state as "
        f"{_name(me)}, leaving files the daemon cannot write. Run as: sudo -u {_name(owner)} {command}"
    )


def refuse_unless_owner(prog: str, state_dir: str, argv: list[str]) -> bool:
    """Print the refusal and return True when the current user does not own `state_dir`."""
    message = not_owner_message(state_dir, argv)
    if message:
        print(f"{prog}: {message}", file=sys.stderr)
    return bool(message)


def baseline_argv(args: argparse.Namespace) -> list[str]:
    """`specwatch baseline`'s command line, for the "run as" advice."""
    flags = ["--config.file", args.config_file] if args.config_file else []
    flags += ["--state.dir", args.state_dir] if args.state_dir else []
    return ["baseline", *flags, args.action, args.route]
