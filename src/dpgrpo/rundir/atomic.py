"""Durable, atomic file writes shared by checkpoints, the privacy journal, reports and audits.

A file is written to a temporary name in its folder, fsynced and renamed over the target, so a
reader sees the old or the new content, never a torn one; a full disk becomes
:class:`~dpgrpo.errors.DiskFullError` with nothing half-written kept. Torch-free, so light
modules (evaluation, reports, the CLI) can use it.

Private files (everything under ``recovery/``) are the owner's only: written files are created
0600 (``mkstemp``, :func:`append_lines`) and :func:`private_dir` makes their folder 0700.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# fsync_file and fsync_dir live below privacy/ and rundir/ (config/durable.py), shared with the
# privacy journal; re-exported here for the checkpoints and the release writer
from dpgrpo.config.durable import fsync_dir as fsync_dir
from dpgrpo.config.durable import fsync_file as fsync_file
from dpgrpo.errors import DiskFullError, ReadOnlyError

#: how torch's zip writer reports a short write (``basic_ios::clear``: the C++ stream failed)
_TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "basic_ios::clear")
#: the OS error codes safetensors' Rust writer puts in its message on a full disk
_RUST_FULL = ("os error 28", "os error 122")


@contextmanager
def disk_full_guard(where: Path) -> Iterator[None]:
    """Turn a full disk (ENOSPC, EDQUOT, torch's short write, safetensors' ``os error 28``)
    into :class:`DiskFullError` and a read-only one (EROFS) into :class:`ReadOnlyError`."""
    try:
        yield
    except (DiskFullError, ReadOnlyError):
        raise
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES):
            raise ReadOnlyError(read_only_message(where, err.errno)) from None
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFullError(full_message(where)) from None
    except RuntimeError as err:  # torch's zip writer reports a short write this way
        if not any(s in str(err) for s in _TORCH_SHORT_WRITE):
            raise
        raise DiskFullError(full_message(where)) from None
    except Exception as err:  # safetensors' SafetensorError is a plain Exception subclass
        if type(err).__name__ != "SafetensorError" or not any(s in str(err) for s in _RUST_FULL):
            raise
        raise DiskFullError(full_message(where)) from None


def read_only_message(where: Path, code: int = errno.EROFS) -> str:
    why = "read-only file system" if code == errno.EROFS else "permission denied"
    return (f"{why}: cannot write {where}; nothing half-written was kept; "
            "choose a writable run directory (or remount it), then start or resume the run")


def full_message(where: Path) -> str:
    try:
        free = shutil.disk_usage(where if where.exists() else where.parent).free
        left = f" ({free:,} bytes free)"
    except OSError:
        left = ""
    return (f"disk full while writing {where}{left}: nothing half-written was kept; free "
            "space, then resume the run (dpgrpo train --resume RUN_DIR)")


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (checkpoints and releases record it
    when written and compare it when read, so a flipped byte is caught, not trained on)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with disk_full_guard(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_json(path: str | Path, data: object) -> None:
    """Write ``data`` as sorted, indented JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) and set it to 0700, also when it existed with a
    wider mode (a run directory written by an older dpgrpo); returns ``path``."""
    with disk_full_guard(path):
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        if path.stat().st_mode & 0o777 != PRIVATE_DIR:
            os.chmod(path, PRIVATE_DIR)
    return path


def private_tree(path: Path) -> Path:
    """:func:`private_dir`, and everything under ``path`` the owner's only (folders 0700,
    files 0600; symbolic links are left alone): a run directory written by an older dpgrpo
    had a 0755 recovery/ with a 0644 telemetry.jsonl and state.pt. Returns ``path``."""
    private_dir(path)
    for root, folders, files in os.walk(path):
        for name, mode in [(f, PRIVATE_DIR) for f in folders] + [(f, PRIVATE_FILE) for f in files]:
            entry = os.path.join(root, name)
            if not os.path.islink(entry) and os.stat(entry).st_mode & 0o777 != mode:
                os.chmod(entry, mode)
    return path


def append_lines(path: Path, lines: list[str]) -> None:
    """Append lines to a private JSONL file, first ending a line torn by a crash (fsynced).
    The file is created 0600, and an existing one is set to 0600 (it holds private values)."""
    if not lines:
        return
    with disk_full_guard(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
    with disk_full_guard(path), os.fdopen(fd, "a+b") as fh:
        if os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write("".join(line + "\n" for line in lines).encode())
        fh.flush()
        os.fsync(fh.fileno())
