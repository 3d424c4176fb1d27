"""OS-level isolation of every sandboxed process (the code verifier's outer layer).

Each sandboxed interpreter runs in fresh user, mount, PID, network, IPC and UTS namespaces:

* the root file system is an empty tmpfs, remounted read-only, holding only what the
  interpreter needs: its executable, the shared libraries it and its extension modules link
  (``ldd``), and its standard library with ``site-packages`` hidden under an empty tmpfs; no
  ``/etc``, ``/home``, ``/proc`` (the unshare script leaves an empty mount point), no run
  directory, no dpgrpo;
* the work directory ``/sandbox`` is a size-limited tmpfs that disappears with the namespace;
* the network namespace has no interface but its own loopback;
* the interpreter is a child of pid 1 of its own PID namespace (the launcher's reaper). If it
  is still running at the end the parent kills pid 1 through a pidfd and reaps the launcher,
  which reaps pid 1: the kernel kills every other process of a namespace before its pid 1 can
  be reaped, so when the verifier returns, no process the completion started exists;
* under bubblewrap the process has no capabilities and uid 65534; under ``unshare`` it is root
  of its own user namespace (capabilities there only).

Launchers, in order of preference: bubblewrap (``bwrap``, Debian package ``bubblewrap``) and
util-linux ``unshare`` (the same namespaces and mounts made by a small ``sh`` script before
``pivot_root``). Each is probed once by starting an interpreter in it. Where neither works
(unprivileged user namespaces disabled, no launcher installed), :func:`require_isolation`
raises :class:`IsolationUnavailable` and the code tasks refuse to run rather than score
completions unisolated.

With bubblewrap, a seccomp filter compiled by libseccomp (``_seccomp_filter.py``, run once by
a system python3 that has its binding) refuses new processes and threads, sockets, tracing,
mounts, namespaces and other kernel surface; where no such python3 exists the namespaces run
without it (:func:`seccomp_filter` says why). No Landlock rules: no well-kept library offers
them to this interpreter (docs/code-sandbox.md).
"""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dpgrpo.errors import ConfigError

WORKDIR = "/sandbox"
WORK_BYTES = 64 * 2**20   # the work tmpfs (each file is capped by RLIMIT_FSIZE as well)
INSTALL_HINT = "apt-get install bubblewrap (Debian/Ubuntu), or allow unprivileged user namespaces"


class IsolationUnavailable(ConfigError):
    """Neither bubblewrap nor unshare can create the sandbox's namespaces on this machine."""


@dataclass(frozen=True)
class Layout:
    """What the sandbox's root holds: the interpreter, its libraries, its standard library."""

    interpreter: str
    files: tuple[str, ...]        # read-only single files (the executable, shared libraries)
    stdlib: str                   # read-only directory
    hidden: tuple[str, ...]       # directories under stdlib masked by an empty tmpfs


@dataclass(frozen=True)
class Launcher:
    """One way to start a command in the namespaces; ``name`` is ``bwrap`` or ``unshare``;
    ``seccomp`` the BPF program bubblewrap loads (:func:`seccomp_filter`), None for none."""

    name: str
    path: str
    seccomp: str | None = None

    def command(self, layout: Layout, argv: list[str],
                seccomp_fd: int | None = None) -> list[str]:
        """The full command line running ``argv`` (inside paths) in fresh namespaces;
        ``seccomp_fd`` an open descriptor of :attr:`seccomp` (bubblewrap reads it)."""
        if self.name == "bwrap":
            return _bwrap(self.path, layout, argv, seccomp_fd)
        return _unshare(self.path, layout, argv)

    def popen(self, layout: Layout, argv: list[str], pass_fds: tuple[int, ...] = (),
              **kwargs) -> subprocess.Popen:
        """Start ``argv`` in the sandbox (``kwargs`` go to :class:`subprocess.Popen`)."""
        seccomp_fd = None if self.seccomp is None else os.open(self.seccomp, os.O_RDONLY)
        extra = () if seccomp_fd is None else (seccomp_fd,)
        try:
            return subprocess.Popen(self.command(layout, argv, seccomp_fd),
                                    pass_fds=(*pass_fds, *extra), **kwargs)
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)


#: Extension modules whose libraries are not bound (so they fail to import in the sandbox):
#: GUI, terminal, TLS and database front ends a verifier never needs, and ctypes. Each one
#: would add its libraries to every run's mounts (tkinter alone brings 15).
UNBOUND_EXTENSIONS = ("_tkinter", "readline", "_curses", "_curses_panel", "nis", "_ssl",
                      "_hashlib", "_dbm", "_gdbm", "_ctypes", "_ctypes_test")


@functools.lru_cache(maxsize=1)
def layout() -> Layout:
    """The base interpreter (never a venv's: a venv's site-packages must stay outside), the
    libraries it and its extension modules link (but :data:`UNBOUND_EXTENSIONS`' own), and
    its standard library. ``hashlib`` falls back to the builtin ``_md5``/``_sha*`` modules."""
    interpreter = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    dynload = os.path.join(stdlib, "lib-dynload")
    objects = [interpreter]
    if os.path.isdir(dynload):
        objects += sorted(str(p) for p in Path(dynload).glob("*.so")
                          if p.name.split(".")[0] not in UNBOUND_EXTENSIONS)
    files = {interpreter}
    files.update(_shared_libraries(objects))
    hidden = tuple(os.path.join(stdlib, name) for name in ("site-packages", "dist-packages")
                   if os.path.isdir(os.path.join(stdlib, name)))
    files = {f for f in files if not f.startswith(stdlib + os.sep)}
    return Layout(interpreter, tuple(sorted(files)), stdlib, hidden)


def _shared_libraries(objects: list[str]) -> set[str]:
    """Every library ``ldd`` resolves for ``objects`` at the path it names (the dynamic loader
    opens that path), the dynamic loader included."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise IsolationUnavailable("the sandbox needs ldd (libc-bin) to find the interpreter's "
                                   "shared libraries")
    done = subprocess.run([ldd, *objects], capture_output=True, text=True, timeout=60)
    found: set[str] = set()
    for line in done.stdout.splitlines():
        for word in line.split():
            if word.startswith("/") and os.path.exists(word):
                found.add(word)
    return found


def _bwrap(path: str, lay: Layout, argv: list[str], seccomp_fd: int | None) -> list[str]:
    """bubblewrap's command line (as root it still makes the user namespace, uid 65534)."""
    command = [path, *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
               "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--uid", "65534", "--gid", "65534",
               "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
               "--disable-userns", "--tmpfs", "/"]
    for file in lay.files:
        command += ["--ro-bind", file, file]
    command += ["--ro-bind", lay.stdlib, lay.stdlib]
    for hidden in lay.hidden:
        command += ["--tmpfs", hidden, "--remount-ro", hidden]
    command += ["--dev", "/dev", "--size", str(WORK_BYTES), "--tmpfs", WORKDIR,
                "--remount-ro", "/", "--chdir", WORKDIR,
                "--setenv", "HOME", WORKDIR, "--setenv", "TMPDIR", WORKDIR,
                "--setenv", "LANG", "C.UTF-8", "--setenv", "PATH", "/nonexistent", *argv]
    return command


def _unshare(path: str, lay: Layout, argv: list[str]) -> list[str]:
    """The same sandbox with util-linux: a script run as root of the new user namespace builds
    the root on a tmpfs, pivots into it, remounts it read-only and starts ``argv`` as pid 2.
    It binds the directories of the libraries (one ``mount`` each), not every file as bubblewrap
    does, so the system's library directories are visible read-only."""
    quote = shlex.quote
    folders = sorted({os.path.dirname(f) for f in lay.files} | {lay.stdlib})
    lines = ["set -e", "export PATH=/usr/sbin:/usr/bin:/sbin:/bin", "R=$(mktemp -d)",
             "mount -t tmpfs -o mode=755 none \"$R\""]
    for folder in folders:
        lines += [f"mkdir -p \"$R\"{quote(folder)}",
                  f"mount -o rbind,ro {quote(folder)} \"$R\"{quote(folder)}"]
    for hidden in lay.hidden:
        lines += [f"mount -t tmpfs -o ro,size=4k none \"$R\"{quote(hidden)}"]
    lines += ["M=$(command -v mount) U=$(command -v umount) P=$(command -v pivot_root)",
              "mkdir -p \"$R\"/dev \"$R\"/old \"$R\"/proc \"$R\"" + WORKDIR,
              ": > \"$R\"/dev/null", "mount -o bind /dev/null \"$R\"/dev/null",
              f"mount -t tmpfs -o size={WORK_BYTES},nosuid,nodev none \"$R\"{WORKDIR}",
              "cd \"$R\"", "$P . old", "/old$M -t proc proc /proc",  # umount reads mountinfo
              "/old$M -o remount,ro,bind /", "/old$U -l /old /proc",
              f"cd {WORKDIR}",
              "export HOME=" + WORKDIR + " TMPDIR=" + WORKDIR + " LANG=C.UTF-8 PATH=/nonexistent",
              " ".join(quote(a) for a in argv) + "; exit $?"]  # not exec'd: sh stays pid 1
    return [path, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
            "--net", "--ipc", "--uts", "/bin/sh", "-c", "\n".join(lines)]


def _probe(launcher: Launcher) -> str | None:
    """None if ``launcher`` starts the interpreter isolated here, else what went wrong."""
    lay = layout()
    code = (f"import os, sys; assert os.getcwd() == {WORKDIR!r}; "
            "assert not os.path.exists('/etc'); print('isolated')")
    try:
        with launcher.popen(lay, [lay.interpreter, "-I", "-S", "-B", "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": os.defpath}) as proc:
            stdout, stderr = proc.communicate(timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode == 0 and done.stdout.strip() == "isolated":
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


@functools.lru_cache(maxsize=1)
def _chosen() -> tuple[Launcher | None, str]:
    problems = []
    for name in ("bwrap", "unshare"):
        path = shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin")
        if path is None:
            problems.append(f"{name}: not installed")
            continue
        filtered = seccomp_filter()[0] if name == "bwrap" else None
        for launcher in dict.fromkeys((Launcher(name, path, filtered), Launcher(name, path))):
            try:
                error = _probe(launcher)
            except IsolationUnavailable as err:
                return None, str(err)
            if error is None:
                return launcher, ""
            problems.append(f"{name}{' with seccomp' if launcher.seccomp else ''}: {error}")
    return None, "; ".join(problems)


@functools.lru_cache(maxsize=1)
def seccomp_filter() -> tuple[str | None, str]:
    """(path of the BPF program written by ``_seccomp_filter.py``, "") or (None, why none):
    it needs a python3 with libseccomp's binding (Debian: ``python3-seccomp``)."""
    script = Path(__file__).with_name("_seccomp_filter.py")
    pythons = dict.fromkeys(p for p in ("/usr/bin/python3", shutil.which("python3")) if p)
    for python in pythons:
        folder = tempfile.mkdtemp(prefix="dpgrpo-seccomp-")
        out = os.path.join(folder, "filter.bpf")
        try:
            done = subprocess.run([python, "-I", str(script), out], capture_output=True,
                                  timeout=60)
        except (OSError, subprocess.SubprocessError):
            done = None
        if (done is not None and done.returncode == 0 and os.path.exists(out)
                and os.path.getsize(out) > 0):
            atexit.register(shutil.rmtree, folder, True)
            return out, ""
        shutil.rmtree(folder, ignore_errors=True)
    return None, "no python3 with libseccomp's binding here (apt-get install python3-seccomp)"


def launcher() -> Launcher | None:
    """The launcher that works here (probed once per process), or None."""
    return _chosen()[0]


def require_isolation() -> Launcher:
    """The working launcher; :class:`IsolationUnavailable` naming why there is none."""
    found, why = _chosen()
    if found is None:
        raise IsolationUnavailable(f"code tasks need OS-level isolation and none works here "
                                   f"({why}); {INSTALL_HINT}")
    return found


__all__ = [
    "INSTALL_HINT",
    "WORKDIR",
    "IsolationUnavailable",
    "Launcher",
    "Layout",
    "launcher",
    "layout",
    "require_isolation",
    "seccomp_filter",
]
