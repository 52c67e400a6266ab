"""Files the chat writes for the user (transcripts, traces) appear whole or not at all, readable by the
user alone."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

UNSYNCABLE_FOLDER = (errno.EINVAL, errno.ENOTSUP, errno.EACCES, errno.EPERM)
TEMP_STEM_CHARS = 100  # of the target's name in its temp file's: room for mkstemp's part within NAME_MAX


def write_text_atomic(path: Path, text: str, overwrite: bool = True) -> None:
    """Write `text` to a new temp file beside `path`, then rename it over `path` in one step; with
    `overwrite` False, an existing `path` (a symlink too) raises FileExistsError and nothing is written.

    The temp file is made by mkstemp: mode 0600, an unpredictable name opened with O_EXCL, so a symlink
    planted at a guessable name is never followed. It is fsynced before the rename and the folder after
    it, so a crash, a full disk or a signal part-way leaves the old file (or none), never half of the
    new one; the temp file is removed on the way out. The file written is 0600.
    """
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    folder = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:TEMP_STEM_CHARS]}.", suffix=".tmp", dir=folder)
    try:
        with open(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(folder)


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable. A folder that cannot be opened for reading (EACCES) or a
    filesystem that cannot fsync one (EINVAL) is let be: the rename itself is done by then."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno not in UNSYNCABLE_FOLDER:
            raise
