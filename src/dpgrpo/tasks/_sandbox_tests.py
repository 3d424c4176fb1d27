"""The trusted tests runner of :mod:`dpgrpo.tasks.sandbox`: assertions far from the completion.

This file is not imported by dpgrpo. Its text, after ``_sandbox_wire.py``'s, runs as
``python -I -S -B -c <text>`` in its own OS sandbox, a second process that imports nothing from
the completion's. It reads one JSON payload from stdin: ``question`` (the problem's own code:
imports, helpers, stubs; trusted), ``tests``, ``remote`` (the names the completion defines),
``limits``, ``request_fd`` and ``response_fd``. It runs the question, binds each remote name to
a proxy that sends the call's arguments as plain data to the completion's process and returns
the fresh builtin value that comes back, then runs the tests. The expected values exist only
here; the completion sees its arguments and nothing else.

Exit status 0 and the line ``dpgrpo-tests: passed`` on stdout only when the tests returned;
1 when they raised (the exception's name goes to stderr), 3 out of memory.
"""

import sys


class RemoteFailure(Exception):
    """The completion's process ended or answered something that is not plain data."""


def _remote(name, request_fd, responses, write, limit):
    """A callable that runs ``name`` in the completion's process."""
    import builtins

    def call(*args, **kwargs):
        line = json.dumps([name, encode(list(args)), encode(kwargs)],
                          separators=(",", ":")).encode("utf-8") + b"\n"
        while line:
            line = line[write(request_fd, line):]
        answer = responses.readline(limit)
        if not answer.endswith(b"\n"):
            raise RemoteFailure(f"no answer from the completion for {name}")
        try:
            reply = json.loads(answer)
            if type(reply) is not dict or len(reply) != 1:
                raise ValueError("not one value")
            if "v" in reply:
                return decode(reply["v"])
            error = getattr(builtins, str(reply["e"]), None)
        except (ValueError, TypeError, KeyError, RecursionError) as err:
            raise RemoteFailure(f"bad answer for {name}: {type(err).__name__}") from None
        if isinstance(error, type) and issubclass(error, Exception):
            raise error(f"raised by {name} in the completion")
        raise RemoteFailure(f"{name} raised {str(reply['e'])[:100]}")

    call.__name__ = call.__qualname__ = name
    return call


def main():
    import os
    import resource

    payload = json.loads(sys.stdin.buffer.read())
    os.close(0)
    limits = payload["limits"]
    for rlimit, value in (("RLIMIT_AS", limits["memory_bytes"]),
                          ("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, rlimit), (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    responses = os.fdopen(payload["response_fd"], "rb")
    limit = 4 * limits["file_bytes"]
    try:
        namespace = {"__name__": "__tests__"}
        exec(compile(payload["question"], "<question>", "exec"), namespace)
        for name in payload["remote"]:
            namespace[name] = _remote(name, payload["request_fd"], responses, os.write, limit)
        exec(compile(payload["tests"], "<tests>", "exec"), namespace)
    except MemoryError:
        os._exit(3)
    except BaseException as err:  # any failure of the tests fails
        os.write(2, f"{type(err).__name__}: {str(err)[:200]}\n".encode("utf-8", "replace"))
        os._exit(1)
    os.write(1, b"dpgrpo-tests: passed\n")
    os._exit(0)


main()
