"""A PostgreSQL server of a test's own: a database cluster made in a temporary folder, started on a free port of
localhost, one database made in it, and stopped (and deleted) when the test is done.

Debian's ``postgresql`` package puts its programs in ``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to
run as root: as root, the cluster belongs to the ``postgres`` user the package makes, and its programs run as
that user (``runuser``). Where none of this is there, or the server does not start, :func:`postgres_server` skips
the test with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

USER = "sslkit"  # the cluster's superuser; localhost connections are trusted
DATABASE = "optuna"


def postgres_programs() -> Path | None:
    """The folder of ``pg_ctl``, ``initdb`` and ``createdb``: on the PATH, else the newest Debian installs."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return installed[-1].parent if installed else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A running server with an empty database; yields its URL, ``postgresql://sslkit@127.0.0.1:PORT/optuna``."""
    programs = postgres_programs()
    if programs is None:
        pytest.skip("no PostgreSQL (pg_ctl) here: apt-get install postgresql")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="sslkit-postgres-"))
    if os.geteuid() == 0:  # PostgreSQL will not run as root: as the user Debian's package makes
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(folder)
            pytest.skip("running as root and no 'postgres' user to run PostgreSQL as")
        if shutil.which("runuser") is None:
            shutil.rmtree(folder)
            pytest.skip("running as root and no runuser to run PostgreSQL as the 'postgres' user")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120, cwd=folder)

    made = run(str(programs / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "--no-sync")
    # No Unix socket (its default folder may not be writable here); TCP on localhost only.
    options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
    started = made.returncode == 0 and (
        run(str(programs / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
    )
    try:
        if made.returncode != 0 or started.returncode != 0:
            reason = (made if made.returncode != 0 else started).stderr.strip().splitlines()[-1:] or ["?"]
            pytest.skip(f"PostgreSQL did not start: {reason[0]}")
        created = run(str(programs / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE)
        assert created.returncode == 0, created.stderr
        yield f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
    finally:
        if started and started.returncode == 0:
            run(str(programs / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
