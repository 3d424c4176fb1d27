"""Durable, atomic file writes shared by checkpoints, the privacy journal, reports and audits.

A file is written to a temporary name in its folder, fsynced and renamed over the target, so a
reader sees the old or the new content, never a torn one; a full disk becomes
:class:`~dpgrpo.errors.DiskFullError` with nothing half-written kept. Torch-free, so light
modules (evaluation, reports, the CLI) can use it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dpgrpo.errors import DiskFullError


@contextmanager
def disk_full_guard(where: Path) -> Iterator[None]:
    """Turn a full disk (ENOSPC, EDQUOT, torch's ``unexpected pos``) into :class:`DiskFullError`."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise DiskFullError(full_message(where)) from None
    except RuntimeError as err:  # torch's zip writer reports a short write this way
        text = str(err)
        if "unexpected pos" not in text and "file write failed" not in text:
            raise
        raise DiskFullError(full_message(where)) from None


def full_message(where: Path) -> str:
    try:
        free = shutil.disk_usage(where if where.exists() else where.parent).free
        left = f" ({free:,} bytes free)"
    except OSError:
        left = ""
    return (f"disk full while writing {where}{left}: nothing half-written was kept; free "
            "space, then resume the run (dpgrpo train --resume RUN_DIR)")


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every filesystem can sync a directory
    finally:
        os.close(fd)


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


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as sorted, indented JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def append_lines(path: Path, lines: list[str]) -> None:
    """Append lines to a JSONL file, first ending a line torn by a crash (fsynced)."""
    if not lines:
        return
    with disk_full_guard(path), open(path, "a+b") as fh:
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write("".join(line + "\n" for line in lines).encode())
        fh.flush()
        os.fsync(fh.fileno())
