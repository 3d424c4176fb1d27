"""The untrusted side of :mod:`dpgrpo.tasks.sandbox`: load a program, then answer calls.

This file is not imported by dpgrpo. Its text, after ``_sandbox_wire.py``'s, is run as
``python -I -S -B -c <text>`` inside the OS sandbox (:mod:`dpgrpo.tasks.isolation`) and reads
one JSON payload from stdin: ``program``, ``limits``, ``workdir``, ``response_fd`` and either
``calls`` (a list of ``[name, args, kwargs]``, plain data on the wire) or ``request_fd`` (the
tests runner sends one such call per line). For each call it writes one line to
``response_fd``: ``{"v": value}`` with the return value encoded by the wire (exact builtin data
only, so an object equal to everything cannot be sent) or ``{"e": "ExceptionName"}``.

The verdict is never computed here: this process never holds the tests or their expected
values, so reading its own frames, patching its builtins or forging responses can only change
what it claims its functions returned. Before the program runs it

1. lowers its resource limits for good (soft = hard): address space, CPU seconds, file size
   (stdout and stderr go to a file, so this also caps the output), processes (0: no fork or
   thread where the kernel enforces it for this uid), open files, core dumps;
2. installs an audit hook (PEP 578), the inner layer, that ends the process with exit status
   97 on any forbidden action: starting processes (fork, exec, spawn, system, subprocess),
   threads, sockets, signals to other processes, ctypes, new code or function objects, the
   gc's object lists, importing modules that do these things, reading files outside the work
   directory and the standard library, and writing anything outside the work directory.

Exit status: 0 every call answered, 1 the program raised, 2 syntax error, 3 out of memory,
97 forbidden action; signals: SIGXCPU (CPU limit), SIGXFSZ (output limit).
"""

import sys


def _guard(workdir, read_roots):
    """The audit hook (the inner layer): its state and path rules live in this closure only."""
    import os

    realpath, fsdecode, fspath = os.path.realpath, os.fsdecode, os.fspath
    write, exit_ = os.write, os._exit
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
    state = {"writes": 0}

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
        if event in deny:
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


def _send(fd, text, write):
    """Write all of ``text`` and a newline to ``fd``."""
    data = text.encode("utf-8") + b"\n"
    while data:
        data = data[write(fd, data):]


def _requests(fd, read, limit):
    """The calls arriving on ``fd``, one JSON line each, until end of file."""
    buffer = b""
    while True:
        cut = buffer.find(b"\n")
        if cut >= 0:
            line, buffer = buffer[:cut], buffer[cut + 1:]
            yield line
            continue
        chunk = read(fd, 65536)
        if not chunk or len(buffer) > limit:
            return
        buffer += chunk


def _answer(namespace, call):
    """The response line of one call ``[name, args, kwargs]``."""
    name, args, kwargs = call
    try:
        target = namespace[name]
        value = target(*decode(args), **decode(kwargs))
        return json.dumps({"v": encode(value)}, separators=(",", ":"))
    except MemoryError:
        raise
    except BaseException as err:  # the callee's failure is its answer
        return json.dumps({"e": type(err).__name__[:100]})


def main():
    import os
    import resource

    exit_, write, read = os._exit, os.write, os.read  # the program cannot patch these locals
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
    sys.addaudithook(_guard(os.path.realpath(payload["workdir"]), read_roots))
    program, calls = payload["program"], payload.get("calls")
    response_fd, request_fd = payload["response_fd"], payload.get("request_fd")
    del payload
    try:
        namespace = {"__name__": "__solution__"}
        exec(compile(program, "<solution>", "exec"), namespace)
        source = calls if calls is not None else (
            json.loads(line) for line in _requests(request_fd, read, 1 << 24))
        for call in source:
            _send(response_fd, _answer(namespace, call), write)
    except SyntaxError:
        write(2, b"SyntaxError\n")
        exit_(2)
    except MemoryError:
        exit_(3)
    except BaseException as err:  # any failure, SystemExit included, fails
        write(2, b"raised " + type(err).__name__.encode("ascii", "replace") + b"\n")
        exit_(1)
    exit_(0)


main()
