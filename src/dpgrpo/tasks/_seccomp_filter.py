"""Write the sandbox's seccomp filter (a BPF program) with libseccomp; run by a system python3.

Not imported by dpgrpo: :mod:`dpgrpo.tasks.isolation` runs this file with an interpreter that
has libseccomp's Python binding (Debian's ``python3-seccomp`` serves only Debian's ``python3``)
and hands the program to bubblewrap (``--seccomp FD``), which loads it just before it starts
the sandboxed interpreter. Everything is allowed except, with EPERM: new processes and threads
(``clone``/``fork``/``vfork``; ``clone3`` answers ENOSYS so that libc falls back to ``clone``),
sockets, tracing other processes, mounting, namespaces, keyrings, BPF, perf events,
userfaultfd, io_uring, kernel modules and kexec, file handles.

    python3 _seccomp_filter.py OUT.bpf
"""

import contextlib
import errno
import sys

import seccomp

DENIED = (
    "clone", "fork", "vfork", "socket", "socketpair", "ptrace", "process_vm_readv",
    "process_vm_writev", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
)


def main(path):
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED:
        with contextlib.suppress(RuntimeError, ValueError):  # a syscall this arch lacks
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with open(path, "wb") as out:
        rules.export_bpf(out)


if __name__ == "__main__":
    main(sys.argv[1])
