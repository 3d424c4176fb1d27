"""The child side of :mod:`dpgrpo.tasks.sandbox`: run a program, then its tests, then say so.

This file is not imported by dpgrpo. Its text is run as ``python -I -S -B -c <text>`` (isolated
mode, no site-packages, no bytecode written) in a fresh temporary directory, and reads one JSON
payload from stdin: ``program``, ``tests``, ``nonce`` (hex), ``workdir``, ``limits``. Before any
untrusted code runs it

1. lowers its resource limits for good (soft = hard): address space, CPU seconds, file size
   (stdout and stderr go to a file, so this also caps the output), processes (0: no fork or
   thread for a non-root user), open files, core dumps;
2. installs an audit hook (PEP 578) that ends the process with exit status 97 on any forbidden
   action: starting processes (fork, exec, spawn, system, subprocess), threads, sockets, signals
   to other processes, ctypes, new code or function objects, the gc's object lists, importing
   modules that do these things, reading files outside the work directory and the standard
   library, and writing, creating or deleting anything outside the work directory. The hook
   holds the pass nonce; it writes it to stdout only when the tests have returned, on an event
   raised once from this file's own ``main``.

The program's top-level functions may return only plain data (exact builtin numbers, strings,
None and containers of them): an object that claims to equal everything cannot pass a test.
The tests run in their own namespace, on a copy of the builtins taken before the program ran.
Exit status: 0 passed (nonce written), 1 a test or the program raised, 2 syntax error,
3 out of memory, 97 forbidden action; signals: SIGXCPU (CPU limit), SIGXFSZ (output limit).
"""

import sys


def _guard(workdir, read_roots, nonce, main_code):
    """The audit hook: state, path rules and the pass nonce live in this closure only."""
    import os

    realpath, fsdecode, fspath = os.path.realpath, os.fsdecode, os.fspath
    write, exit_, getframe = os.write, os._exit, sys._getframe
    sep = os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    deny = frozenset((
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "os.kill", "os.killpg", "os.startfile", "subprocess.Popen", "pty.spawn",
        "_thread.start_new_thread", "signal.pthread_kill", "socket.__new__", "socket.bind",
        "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "code.__new__", "function.__new__",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
        "resource.setrlimit", "resource.prlimit", "sys.settrace", "sys.setprofile",
        "urllib.Request", "webbrowser.open"))
    deny_modules = frozenset((
        "ctypes", "_ctypes", "subprocess", "_posixsubprocess", "multiprocessing",
        "_multiprocessing", "socket", "_socket", "ssl", "_ssl", "pty", "_xxsubinterpreters",
        "_testcapi", "_testinternalcapi", "asyncio", "concurrent"))
    reads = frozenset(("os.listdir", "os.scandir", "os.chdir", "glob.glob", "os.getxattr",
                       "os.listxattr"))
    writes = frozenset((
        "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.link", "os.symlink",
        "os.truncate", "os.chmod", "os.chown", "os.utime", "os.chflags", "os.lchflags",
        "os.lchmod", "os.lchown", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr",
        "shutil.rmtree", "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.chown",
        "shutil.make_archive", "shutil.unpack_archive", "tempfile.mkstemp",
        "tempfile.mkdtemp"))
    state = {"phase": 0, "writes": 0}

    def forbid(event):
        write(2, b"dpgrpo-sandbox: forbidden " + event.encode("ascii", "replace") + b"\n")
        exit_(97)

    def inside(path, roots):
        if path is None:
            path = "."
        if isinstance(path, int):
            return True  # an open descriptor: only ones this process was allowed to open
        try:
            resolved = realpath(fsdecode(fspath(path)))
        except (TypeError, ValueError):
            return False
        return any(resolved == root or resolved.startswith(root + sep) for root in roots)

    def paths(args):
        return [a for a in args if isinstance(a, (str, bytes)) or hasattr(a, "__fspath__")]

    def hook(event, args):
        if event == "dpgrpo.start":
            if state["phase"] != 0 or getframe(1).f_code is not main_code:
                forbid(event)
            state["phase"] = 1
        elif event == "dpgrpo.passed":
            if state["phase"] != 1 or getframe(1).f_code is not main_code:
                forbid(event)
            write(1, b"\n" + nonce + b"\n")
            exit_(0)
        elif event in deny:
            forbid(event)
        elif event == "import":
            if args[0].partition(".")[0] in deny_modules:
                forbid("import " + args[0])
        elif event == "open":
            path, mode, flags = args
            writing = bool((flags or 0) & write_flags) or any(c in (mode or "") for c in "wax+")
            if writing or mode is None:  # os.open (descriptor-level): work directory only
                state["writes"] += writing
                if not inside(path, (workdir,)) or state["writes"] > 256:
                    forbid("open " + str(path))
            elif not inside(path, (workdir, *read_roots)):
                forbid("open " + str(path))
        elif event in reads:
            if not all(inside(p, (workdir, *read_roots)) for p in paths(args[:1]) or [None]):
                forbid(event)
        elif event in writes:
            state["writes"] += 1
            if state["writes"] > 256 or not all(inside(p, (workdir,)) for p in paths(args)):
                forbid(event)

    return hook


def _plain_returns(fn, plain_atoms, containers):
    """``fn`` whose return value must be plain data (exact builtin types, walked iteratively)."""
    type_ = type

    def plain(value):
        stack, seen = [value], 0
        while stack:
            item = stack.pop()
            seen += 1
            kind = type_(item)
            if seen > 1_000_000:
                return False
            if kind in plain_atoms:
                continue
            if kind not in containers:
                return False
            stack.extend(item.items() if kind is dict else item)
        return True

    def wrapper(*args, **kwargs):
        value = fn(*args, **kwargs)
        if not plain(value):
            raise TypeError(f"{fn.__name__} returned {type_(value).__name__}, not plain data")
        return value

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def main():
    import builtins
    import json
    import os
    import resource

    exit_, write, type_ = os._exit, os.write, type  # the program cannot patch these locals
    payload = json.loads(sys.stdin.buffer.read())
    os.close(0)
    limits = payload["limits"]
    for name, soft, hard in (("RLIMIT_AS", limits["memory_bytes"], limits["memory_bytes"]),
                             ("RLIMIT_CPU", limits["cpu_seconds"], limits["cpu_seconds"] + 1),
                             ("RLIMIT_FSIZE", limits["file_bytes"], limits["file_bytes"]),
                             ("RLIMIT_NPROC", 0, 0), ("RLIMIT_NOFILE", 64, 64),
                             ("RLIMIT_CORE", 0, 0)):
        if hasattr(resource, name):
            resource.setrlimit(getattr(resource, name), (soft, hard))
    read_roots = tuple(os.path.realpath(p) for p in sys.path if p and os.path.exists(p))
    audit = sys.audit
    sys.addaudithook(_guard(os.path.realpath(payload["workdir"]), read_roots,
                            payload["nonce"].encode("ascii"), sys._getframe().f_code))
    program, tests = payload["program"], payload["tests"]
    del payload
    saved = dict(builtins.__dict__)
    atoms = (int, float, complex, bool, str, bytes, type(None))
    containers = (list, tuple, set, frozenset, dict)
    function = type(main)
    del globals()["main"], globals()["_guard"]  # nothing can run them again
    audit("dpgrpo.start")
    try:
        namespace = {"__name__": "__solution__"}
        exec(compile(program, "<solution>", "exec"), namespace)
        builtins.__dict__.clear()
        builtins.__dict__.update(saved)
        for key, value in list(namespace.items()):
            if type(value) is function and value.__code__.co_filename == "<solution>":
                namespace[key] = _plain_returns(value, atoms, containers)
        checks = {**namespace, "__name__": "__tests__", "__builtins__": dict(saved)}
        exec(compile(tests, "<tests>", "exec"), checks)
    except SyntaxError:
        write(2, b"SyntaxError\n")
        exit_(2)
    except MemoryError:
        exit_(3)
    except BaseException as err:  # noqa: BLE001 - any failure, SystemExit included, fails
        write(2, b"raised " + type_(err).__name__.encode("ascii", "replace") + b"\n")
        exit_(1)
    audit("dpgrpo.passed")
    exit_(1)  # not reached: the hook ends the process


main()
