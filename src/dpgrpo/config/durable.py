"""File durability: fsync a written file, and a folder so that a new or renamed entry survives.

Standard library only, at the bottom of the package (config/ is the lowest layer with modules;
docs/architecture.md, Layers) so that the privacy journal (:mod:`dpgrpo.privacy.journal`) and the
run directory's atomic writer (:mod:`dpgrpo.rundir.atomic`, which re-exports both) share one
copy without either importing the other: the journal sits below rundir/, and rundir/ must not
import the accountant (scipy) that the journal does. Not configuration: it lives in config/ only
because nothing lower holds modules.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: Path) -> None:
    """Flush a written file's data to disk (it must exist and be readable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries durable (a file just created or renamed into it); best effort:
    a folder that cannot be opened, or a filesystem that cannot sync one, is left as it is."""
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
