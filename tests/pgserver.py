"""A throwaway PostgreSQL server on loopback for the cache tests (Debian's postgresql package)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile


def find_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self):
        self.initdb, self.pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        if not (self.initdb and self.pg_ctl):
            raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found; "
                                    "install Debian's postgresql package")
        self.dir = tempfile.mkdtemp(prefix="convtune-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        # the server refuses to run as root: run it as the package's postgres user then
        self.prefix = []
        if os.geteuid() == 0:
            os.chmod(self.dir, 0o777)
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args):
        subprocess.run(self.prefix + list(args), check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start(self) -> "PgServer":
        self._run(self.initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
        self._run(self.pg_ctl, "-D", self.data, "-o", opts, "-l", os.path.join(self.dir, "log"), "-w", "start")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def pids(self) -> list[int]:
        """The server's processes: the postmaster and its children (what a test freezes with SIGSTOP)."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as fh:
                main_pid = int(fh.readline())
        except (OSError, ValueError):
            return []
        pids = [main_pid]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        if int(fh.read().rsplit(")", 1)[1].split()[1]) == main_pid:
                            pids.append(int(entry))
                except (OSError, ValueError, IndexError):
                    pass
        return pids

    def stop(self):
        try:
            self._run(self.pg_ctl, "-D", self.data, "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
