"""A real one-node SLURM cluster, with accounting, for CI and for trying the SLURM path on a laptop.

    bash .ci/slurm install         apt-get the packages (Debian/Ubuntu, as root) unless already there
    bash .ci/slurm up              start the cluster (idempotent; safe to call concurrently), then print
                                   the line `export SLURM_CONF=<dir>/etc/slurm.conf`
    eval "$(bash .ci/slurm env)"   point sbatch/squeue/sacct/... of this shell at the cluster
    bash .ci/slurm status          sinfo and where the config is (exit 0), or why it is not up (exit 1)
    bash .ci/slurm down [--purge]  stop every daemon it started (and, with --purge, delete the folder)

`.ci/slurm` runs this file with the system's python3 (3.9 or later; the standard library only: `install` runs
before the project's environment exists). tests/conftest.py's `slurm_cluster` imports it and calls `Cluster().up()`.
Errors end a command with `slurm: error: <what is wrong>` on stderr and exit 1.

Needs root (the daemons and the jobs run as root: SlurmUser=SlurmdUser=root), Debian 12's packages
(SLURM 22.05: slurmctld slurmd slurm-client slurmdbd, munge, mariadb-server), no systemd and no
cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, JobAcctGatherType=linux).

Everything lives under one scratch folder, DAPO_SLURM_DIR (default /tmp/dapo-slurm); nothing under /etc
is written (apart from what `apt-get install` itself installs):
  etc/     slurm.conf, slurmdbd.conf (mode 0600), gres.conf     (clients: SLURM_CONF=<dir>/etc/slurm.conf)
  munge/   munge.key (1 KiB from /dev/urandom, mode 0400), munge.socket.2, munged.seed
  mysql/   MariaDB's data (mariadb-install-db on first use), its socket mysqld.sock, its tmpdir
  state/   slurmctld's StateSaveLocation;  spool/  slurmd's SlurmdSpoolDir
  run/     the pid files of all five daemons;  log/  their logs (look here when `up` fails)
  dev/     gpu0..gpu7 -> /dev/null: the fake GPUs of the GRES gpu:8 (DAPO_SLURM_GPUS=N for another count)
and the lock <dir>.lock (flock: two concurrent `up`/`down` do not race).

What `up` starts, in order, each in its own session with its output in log/ (the steps, below, say how):
munged, mariadbd, slurmdbd, slurmctld (ports 6817 for slurmctld, 6818 for slurmd, 6819 for slurmdbd:
DAPO_SLURM_PORT=<p> moves them), slurmd; then it waits (60 s at most) for sinfo to show the node idle.
Why each setting of slurm.conf is chosen: `Cluster.configs`. What `down` does: `Cluster.down`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

CLUSTER = "dapo"
PKGS = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
# what `up` starts and runs, and the clients the SLURM tests run
BINS = ("slurmctld", "slurmd", "slurmdbd", "munged", "munge", "unmunge", "mariadbd", "mariadb", "mariadb-install-db",
        "sbatch", "sacct", "sacctmgr", "scontrol", "scancel", "squeue", "sinfo")
SUBDIRS = ("etc", "munge", "mysql", "state", "spool", "run", "log", "dev")  # all that `up` creates under the folder
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")  # the order `up` starts them in
READY = ("idle", "mixed", "allocated", "completing")  # the node's states in which it takes jobs
# the system's folders first (the daemons live in sbin), then the caller's
PATH = ":".join(filter(None, ["/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", os.environ.get("PATH")]))
PROC = Path("/proc")


class Fail(Exception):
    """What ends a command: `slurm: error: <message>` on stderr, exit 1 (what explains it is printed before)."""


def missing_binaries() -> list[str]:
    return [b for b in BINS if shutil.which(b, path=PATH) is None]


def tail(text: str, lines: int = 15) -> str:
    return "".join(text.splitlines(keepends=True)[-lines:])


def wait_for(check, seconds: float, every: float = 0.5) -> bool:
    """Call `check` every `every` seconds until it returns something true (True) or `seconds` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def install() -> None:
    """apt-get the packages, unless every binary is already there."""
    missing, pkgs = " ".join(missing_binaries()), " ".join(PKGS)
    if not missing:
        print("slurm: packages already installed")
        return
    if os.geteuid() != 0:
        raise Fail(f"installing needs root (missing: {missing}); rerun as root")
    if not shutil.which("apt-get", path=PATH):
        raise Fail(f"no apt-get on this machine (missing: {missing}); install SLURM 22.05+, munge and MariaDB yourself")
    print(f"slurm: installing {pkgs} (missing: {missing})", file=sys.stderr)
    output = []

    def apt(*args: str) -> bool:
        done = subprocess.run(["apt-get", *args], env={**os.environ, "PATH": PATH, "DEBIAN_FRONTEND": "noninteractive"},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True)
        output.append(done.stdout + done.stderr)
        return done.returncode == 0

    # Keep the packages' maintainer scripts from starting the system's own daemons (no systemd here anyway):
    # a temporary policy-rc.d, unless one is already in place.
    policy = Path("/usr/sbin/policy-rc.d")
    made = not os.path.lexists(policy)
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:  # stale or absent package lists (a fresh container): update them and try again
        args = ("install", "-y", "-qq", "--no-install-recommends", *PKGS)
        installed = apt(*args) or (apt("update", "-qq") and apt(*args))
    finally:
        if made:
            policy.unlink()
    if not installed:
        print(tail("".join(output), 20), end="", file=sys.stderr)
        raise Fail(f"apt-get install {pkgs} failed (output above)")
    if missing_binaries():
        raise Fail(f"installed {pkgs} but still missing: {' '.join(missing_binaries())}")
    print(f"slurm: installed {pkgs}")


def stat(pid: int | str, proc: Path = PROC) -> list[str]:
    """The fields of <proc>/<pid>/stat after the name: [state, ppid, ...]; [] when there is no such process."""
    try:
        return (proc / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def running(pid: int | str, proc: Path = PROC) -> bool:
    """Whether the process exists and is not a zombie (dead, its parent not having reaped it yet)."""
    return stat(pid, proc)[:1] not in ([], ["Z"])


def live_pid(run_dir: Path, name: str, proc: Path = PROC) -> int | None:
    """The pid in <run_dir>/<name>.pid when that process runs and is <name> (<proc>/<pid>/comm: not a recycled
    pid), else None."""
    try:
        pid = "".join(c for c in (run_dir / f"{name}.pid").read_text() if c.isdigit())
        comm = (proc / pid / "comm").read_text().strip() if pid else None
    except OSError:
        return None
    names = ("mariadbd", "mysqld") if name == "mariadbd" else (name,)  # (MariaDB's may call itself mysqld)
    return int(pid) if comm in names and running(pid, proc) else None


def foreign_entries(folder: Path) -> list[str]:
    """The entries of the folder that `up` does not create (`down --purge` refuses to delete a folder holding any)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in SUBDIRS) if folder.is_dir() else []


def job_processes(conf: Path, proc: Path = PROC) -> list[int]:
    """The slurmstepd processes of the cluster of `conf` (their environment carries SLURM_CONF=conf) and every process
    under them (from /proc: no procps needed)."""
    found = []
    for p in proc.glob("[0-9]*"):
        with suppress(OSError):
            if (p / "comm").read_text().strip() == "slurmstepd" and \
                    f"SLURM_CONF={conf}".encode() in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
    parents, new = {int(p.name): stat(p.name, proc)[1:2] for p in proc.glob("[0-9]*")}, found
    while new:
        new = [child for child, ppid in parents.items() if ppid and int(ppid[0]) in new]
        found += new
    return found


def stop(pids: list[int], grace: float = 15, signals=(signal.SIGTERM, signal.SIGKILL)) -> None:
    """Send each signal in turn to all (SIGTERM, then SIGKILL), each time waiting up to `grace` seconds for them."""
    for sig in signals:
        for pid in pids:
            with suppress(OSError):  # (gone already)
                os.kill(pid, sig)
        if wait_for(lambda: not any(running(p) for p in pids), grace, every=0.1):
            return


def setting(variable: str, default: int) -> int:
    value = os.environ.get(variable) or str(default)
    if not value.isdigit():
        raise Fail(f"{variable}={value} is not a number")
    return int(value)


class Cluster:
    """The cluster under `folder` (default: DAPO_SLURM_DIR, else /tmp/dapo-slurm), its three ports from `port`
    (DAPO_SLURM_PORT, else 6817), with `gpus` fake GPUs (DAPO_SLURM_GPUS, else 8), its node `node` (`hostname -s`)."""

    def __init__(self, folder: str | Path | None = None, port: int | None = None, gpus: int | None = None,
                 node: str | None = None):
        self.dir = Path(os.path.realpath(folder or os.environ.get("DAPO_SLURM_DIR") or "/tmp/dapo-slurm"))
        self.port = setting("DAPO_SLURM_PORT", 6817) if port is None else port
        self.gpus = setting("DAPO_SLURM_GPUS", 8) if gpus is None else gpus
        self.node = node or socket.gethostname().split(".")[0]
        self.conf = self.dir / "etc" / "slurm.conf"
        self.sock = self.dir / "munge" / "munge.socket.2"
        self.mysql_sock = self.dir / "mysql" / "mysqld.sock"

    # ----------------------------------------------------------------------------------------------------- helpers
    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": PATH, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, input: str = "") -> subprocess.CompletedProcess:
        """A client command of this cluster, its output captured; one that hangs (10 s) reads as exit 124."""
        try:
            return subprocess.run(cmd, input=input, env=self.env(), capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(cmd, 124, "", str(exc))

    def pid(self, daemon: str) -> int | None:
        return live_pid(self.dir / "run", daemon)

    def start(self, name: str, cmd: list[str], ready, seconds: float = 60) -> None:
        """Spawn the daemon unless it runs, then wait until it runs and `ready()`; else fail with its last log lines.
        Spawned detached (setsid --fork: its own session, a child of init rather than of this process, which may be a
        long test run), without the caller's terminal, pipes or lock, in a clean environment pointing at this
        cluster, its output appended to log/<name>.out."""
        if not self.pid(name):
            env = {"PATH": PATH, "HOME": os.environ.get("HOME") or "/root", "LANG": "C.UTF-8",
                   "SLURM_CONF": str(self.conf), "MYSQL_UNIX_PORT": str(self.mysql_sock)}
            with open(self.dir / "log" / f"{name}.out", "ab") as out:
                subprocess.run(["setsid", "--fork", *cmd], env=env, cwd=self.dir, stdin=subprocess.DEVNULL,
                               stdout=out, stderr=out)
        if not wait_for(lambda: self.pid(name) and ready(), seconds):
            for log in (self.dir / "log" / f"{name}.{ext}" for ext in ("log", "out")):
                if log.is_file() and log.stat().st_size:
                    print(f"--- last lines of {log}:\n{tail(log.read_text(errors='replace'))}", end="", file=sys.stderr)
            raise Fail(f"{name} did not come up (logs above, in {self.dir}/log/)")

    @contextmanager
    def lock(self, seconds: float = 300):
        """Hold <dir>.lock (flock), so that two concurrent `up`/`down` do not race."""
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.dir}.lock", "w") as lock:
            def took() -> bool:
                with suppress(BlockingIOError):
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                return False

            if not wait_for(took, seconds, every=0.2):
                raise Fail(f"timed out ({seconds:.0f} s) waiting for the lock {lock.name} (another up/down running?)")
            yield

    def mysql(self, sql: str) -> subprocess.CompletedProcess:
        return self.run("mariadb", "--no-defaults", f"--socket={self.mysql_sock}", "-u", "root", "-e", sql)

    def node_state(self, fmt: str = "%T") -> str:
        return self.run("sinfo", "-h", "-N", "-n", self.node, "-o", fmt).stdout.partition("\n")[0].strip()

    def answers(self) -> bool:
        """slurmctld answers (scontrol ping)."""
        return "is UP" in self.run("scontrol", "ping").stdout

    def problem(self) -> str | None:
        """Why the cluster is not up; None when it is (every daemon alive, slurmctld answering, the node usable)."""
        if not self.conf.is_file():
            return f"no config at {self.conf} (run `bash .ci/slurm up`)"
        dead = [d for d in DAEMONS if not self.pid(d)]
        if dead:
            return f"not running: {' '.join(dead)} (no live pid in {self.dir}/run/; `bash .ci/slurm up` starts them)"
        if not self.answers():
            return f"slurmctld does not answer (scontrol ping; log: {self.dir}/log/slurmctld.log)"
        state = self.node_state()
        return None if state in READY else f"node {self.node} is {state or 'unknown'} (log: {self.dir}/log/slurmd.log)"

    # ------------------------------------------------------------------------------------------------- the configs
    def configs(self, cpus: int, mem_mb: int) -> dict[str, str]:
        """The files of etc/, name: text, for a node of `cpus` CPUs and `mem_mb` MiB. Settings chosen, and why:

        AuthInfo=socket=<dir>/munge/munge.socket.2,cred_expire=10
            socket: our own munged (clients read AuthInfo from slurm.conf too; sacct/sacctmgr, which talk to
            slurmdbd, take the socket from AccountingStoragePass, set to the same path). cred_expire (default
            120 s) is also how long a requeued job must wait before it may start again: 10 s keeps requeue tests
            short.
        SchedulerParameters=sched_interval=2,bf_interval=5
            the main scheduling loop runs every 2 s instead of 60 s (backfill every 5 s instead of 30), so a
            requeued job (its begin time: now + cred_expire) runs again ~12 s after `scontrol requeue`
            (measured here) instead of ~121 s with the defaults.
        a SHORT folder: munge's socket path has to fit a Unix socket name (108 bytes), hence /tmp/dapo-slurm
            and not a folder deep in a checkout (`up` refuses a folder whose socket path is too long).
        ReturnToService=2 (a node that was down comes back when its slurmd registers, e.g. after down/up),
        JobRequeue=1 (batch jobs are requeued by default), MinJobAge=300, KillWait=2, InactiveLimit=0,
        SelectType=select/cons_tres with CR_Core (jobs share the node by cores; no --mem needed),
        GresTypes=gpu with File= symlinks to /dev/null: `sbatch --test-only --gpus-per-node=N` checks a
            placement (N <= 8 fits, more is refused); jobs that really need GPUs are not meant to run here.
        The node: `hostname -s` at 127.0.0.1; the partition `debug` (Default=YES, MaxTime=INFINITE).
        """
        d, node, port, n = self.dir, self.node, self.port, self.gpus
        slurm_conf = f"""\
# Written by .ci/slurm (a one-node test cluster; .ci/slurm_cluster.py says why each setting). Rewritten on each `up`.
ClusterName={CLUSTER}
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={port}
SlurmdPort={port + 1}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.sock},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/slurmd
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={port + 2}
AccountingStoragePass={self.sock}
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
MinJobAge=300
KillWait=2
InactiveLimit=0
SlurmctldTimeout=60
SlurmdTimeout=60
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={cpus} RealMemory={mem_mb}{f" Gres=gpu:{n}" if n else ""} \
State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
        slurmdbd_conf = f"""\
# Written by .ci/slurm. MariaDB is reached over its socket, {self.mysql_sock} (MYSQL_UNIX_PORT).
AuthType=auth/munge
AuthInfo=socket={self.sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={port + 2}
SlurmUser=root
PidFile={d}/run/slurmdbd.pid
LogFile={d}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
"""
        gres = f"NodeName={node} Name=gpu File={d}/dev/gpu[0-{n - 1}]\n" if n else ""
        return {"slurm.conf": slurm_conf, "gres.conf": "AutoDetect=off\n" + gres, "slurmdbd.conf": slurmdbd_conf}

    def write_configs(self, cpus: int | None = None, mem_mb: int | None = None) -> None:
        """etc/'s files, each replaced at once (slurmdbd.conf mode 0600), and the fake GPUs dev/gpu<i> -> /dev/null.
        By default the node has the CPUs this process may use (`nproc`) and 90% of MemTotal."""
        if mem_mb is None:
            meminfo = Path("/proc/meminfo").read_text().splitlines()
            mem_mb = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemTotal:")) * 9 // 10 // 1024
        for sub in ("etc", "dev"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            (self.dir / "dev" / f"gpu{i}").unlink(missing_ok=True)
            (self.dir / "dev" / f"gpu{i}").symlink_to("/dev/null")
        for name, text in self.configs(cpus or len(os.sched_getaffinity(0)), mem_mb).items():
            tmp = self.dir / "etc" / f"{name}.tmp"
            tmp.unlink(missing_ok=True)
            tmp.touch(0o600 if name == "slurmdbd.conf" else 0o644)
            tmp.write_text(text)
            tmp.replace(self.dir / "etc" / name)

    # ----------------------------------------------------------------------------------------------- the daemons
    def start_munged(self) -> None:
        """munged with its own key (1 KiB from /dev/urandom, mode 0400), socket, pid, log and seed files; ready when
        a credential it made decodes."""
        key = self.dir / "munge" / "munge.key"
        if not self.pid("munged"):
            if not key.is_file() or not key.stat().st_size:
                key.unlink(missing_ok=True)
                key.touch(0o600)
                key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
            self.sock.unlink(missing_ok=True)
            Path(f"{self.sock}.lock").unlink(missing_ok=True)

        def decodes():
            cred = self.run("munge", "-n", f"--socket={self.sock}").stdout
            return bool(cred) and self.run("unmunge", f"--socket={self.sock}", input=cred).returncode == 0

        self.start("munged", ["munged", "--force", f"--socket={self.sock}", f"--key-file={key}",
                              f"--pid-file={self.dir}/run/munged.pid", f"--log-file={self.dir}/log/munged.log",
                              f"--seed-file={self.dir}/munge/munged.seed"], decodes, seconds=20)

    def start_mariadb(self) -> None:
        """MariaDB for slurmdbd: --no-defaults, its own data (mariadb-install-db on first use), --skip-networking
        (the socket only), --user=root; then the database slurm_acct_db."""
        data, log = self.dir / "mysql" / "data", self.dir / "log" / "mariadb-install.log"
        if not self.pid("mariadbd"):
            if not (data / "mysql").is_dir():
                shutil.rmtree(data, ignore_errors=True)
                with open(log, "ab") as out:
                    made = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                                           "--auth-root-authentication-method=socket", "--skip-test-db"],
                                          env=self.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
                if made.returncode != 0:
                    print(tail(log.read_text()), end="", file=sys.stderr)
                    raise Fail(f"mariadb-install-db failed (log: {log})")
            self.mysql_sock.unlink(missing_ok=True)
        self.start("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={self.mysql_sock}",
                                f"--pid-file={self.dir}/run/mariadbd.pid", f"--log-error={self.dir}/log/mariadbd.log",
                                f"--tmpdir={self.dir}/mysql/tmp", "--skip-networking", "--user=root", "--skip-log-bin",
                                "--innodb-buffer-pool-size=128M", "--innodb-log-file-size=64M",
                                "--innodb-lock-wait-timeout=900", "--max-connections=100"],
                   lambda: self.mysql("SELECT 1").returncode == 0)
        made = self.mysql("CREATE DATABASE IF NOT EXISTS slurm_acct_db")
        if made.returncode != 0:
            raise Fail(f"cannot create the database slurm_acct_db: {made.stderr.strip()}")

    def start_slurmdbd(self) -> None:
        """slurmdbd, the accounting (without it `sacct` fails, and submitit-based sweeps wait forever after a
        scancel); it reaches MariaDB over the socket (MYSQL_UNIX_PORT). Then the cluster is registered."""
        def clusters():
            return self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster")

        self.start("slurmdbd", ["slurmdbd"], lambda: clusters().returncode == 0)
        registered = CLUSTER in clusters().stdout.split()
        if not registered and self.run("sacctmgr", "-i", "add", "cluster", CLUSTER).returncode != 0:
            raise Fail(f"sacctmgr -i add cluster {CLUSTER} failed")

    def start_slurmctld(self) -> None:
        self.start("slurmctld", ["slurmctld"], self.answers)

    def start_slurmd(self) -> None:
        """slurmd, ready when sinfo shows its node usable (idle, ...)."""
        try:
            self.start("slurmd", ["slurmd", "-N", self.node], lambda: self.node_state() in READY)
        except Fail:
            state = self.node_state("%T (reason: %E)") or "not listed by sinfo"
            print(f"slurm: node {self.node} is {state} after 60 s", file=sys.stderr)
            raise

    # ---------------------------------------------------------------------------------------------- the commands
    def up(self) -> Path:
        """Start what is not running, in order, each daemon waited for; the path of slurm.conf (SLURM_CONF)."""
        if not self.problem():
            return self.conf  # already up: any user may ask for the line
        if len(str(self.sock)) > 100:
            raise Fail(f"DAPO_SLURM_DIR={self.dir} is too long: munge's socket path ({self.sock}) must stay under "
                       "100 bytes; use a short folder like /tmp/dapo-slurm")
        if os.geteuid() != 0:
            raise Fail("`up` needs root (the daemons run as root: SlurmUser=root)")
        if missing_binaries():
            raise Fail(f"missing: {' '.join(missing_binaries())} (run `bash .ci/slurm install` first)")
        with self.lock():
            if not self.problem():
                return self.conf  # (another caller brought it up while we waited)
            for sub in (*SUBDIRS, "mysql/tmp", "spool/slurmd"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
            self.dir.chmod(0o755)
            (self.dir / "munge").chmod(0o755)
            if not self.pid("slurmctld") and not self.pid("slurmd"):
                self.write_configs()
            elif not self.conf.is_file():
                raise Fail(f"slurmctld/slurmd are running but {self.conf} is gone: run `bash .ci/slurm down` first")
            for step in (self.start_munged, self.start_mariadb, self.start_slurmdbd, self.start_slurmctld,
                         self.start_slurmd):
                step()
            for pid_file in (self.dir / "run").glob("*.pid"):  # (mariadbd writes its own 0660): `status` for anyone
                pid_file.chmod(0o644)
        return self.conf

    def status(self) -> int:
        """Say whether the cluster is up (and sinfo's table, exit 0) or why not (exit 1)."""
        problem = self.problem()
        if problem:
            print(f"slurm: not up: {problem}")
            return 1
        print(f'slurm: up (cluster {CLUSTER}, config {self.conf}; eval "$(bash .ci/slurm env)")', flush=True)
        return subprocess.run(["sinfo"], env=self.env()).returncode

    def down(self, purge: bool = False) -> None:
        """Cancel the jobs still queued or running (scancel: sacct records them CANCELLED; none comes back as a
        phantom RUNNING job after the next `up`), kill any job step (slurmstepd) left and what runs under it, then
        stop the daemons in three waves, each waiting for the one before (SIGTERM, SIGKILL after 15 s): slurmd and
        slurmctld, then slurmdbd, then mariadbd and munged. `purge`: delete the folder too, only if it holds
        nothing but what `up` puts there (the lock file <dir>.lock stays: others may wait on it)."""
        if purge and foreign_entries(self.dir):
            raise Fail(f"not purging {self.dir}: it holds {', '.join(foreign_entries(self.dir))}, which `up` did not "
                       "create (is DAPO_SLURM_DIR right?)")
        if os.geteuid() != 0:
            raise Fail("`down` needs root (the daemons run as root)")
        with self.lock():
            jobs = self.run("squeue", "-h", "-o", "%A").stdout.split() if self.pid("slurmctld") else []
            if jobs:
                if self.run("scancel", *jobs).returncode == 0:
                    print(f"slurm: cancelled the jobs {' '.join(jobs)}")
                wait_for(lambda: not self.run("squeue", "-h", "-o", "%A").stdout.strip(), 15)
            stop(job_processes(self.conf), signals=(signal.SIGKILL,))
            stopped = []
            for wave in (("slurmd", "slurmctld"), ("slurmdbd",), ("mariadbd", "munged")):
                pids = {d: pid for d in wave if (pid := self.pid(d))}
                stop(list(pids.values()))
                stopped += pids
                for d in wave:
                    (self.dir / "run" / f"{d}.pid").unlink(missing_ok=True)
            print(f"slurm: stopped {' '.join(stopped)}" if stopped else "slurm: nothing was running")
            if purge:
                shutil.rmtree(self.dir, ignore_errors=True)
                print(f"slurm: removed {self.dir}")


def main(argv: list[str]) -> int:
    command, option = (argv + ["", ""])[:2]
    try:
        if command == "install":
            install()
        elif command == "status":
            return Cluster().status()
        elif command == "down" and option in ("", "--purge"):
            Cluster().down(purge=option == "--purge")
        elif command == "down":
            raise Fail(f"unknown option to down: {option} (only --purge)")
        elif command == "env" and not Cluster().conf.is_file():
            raise Fail(f"no cluster config at {Cluster().conf} (run `bash .ci/slurm up` first)")
        elif command in ("up", "env"):
            print(f"export SLURM_CONF={Cluster().up() if command == 'up' else Cluster().conf}")
        else:
            raise Fail(f"usage: bash .ci/slurm install|up|env|status|down [--purge]   (got: {command or 'nothing'})")
        return 0
    except (Fail, OSError) as exc:
        print(f"slurm: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
