"""Test helpers for authentication: a users file, and the ``gateway serve`` arguments that use it."""

from __future__ import annotations

import itertools
import os

_files = itertools.count()


def users_file(directory: str, users: dict[str, str]) -> str:
    """Write ``name:password`` lines for ``users`` under ``directory``; the file's path."""
    path = os.path.join(str(directory), f"users-{next(_files)}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{name}:{password}\n" for name, password in users.items())
    os.chmod(path, 0o600)
    return path


def auth_args(directory: str, users: dict[str, str], require: str = "") -> tuple[str, ...]:
    """``--users-file`` with ``users``, and ``--require-auth require`` when given."""
    args = ("--users-file", users_file(directory, users))
    return (*args, "--require-auth", require) if require else args
