"""Files the chat writes for the user (transcripts, traces) appear whole or not at all, readable by the
user alone."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import time
from pathlib import Path

UNSYNCABLE_FOLDER = (errno.EINVAL, errno.ENOTSUP, errno.EACCES, errno.EPERM)
TEMP_STEM_CHARS = 100  # of the target's name in its temp file's: room for mkstemp's part within NAME_MAX
STALE_TEMP_S = 60.0  # a temp file of ours older than this was left by a write that was killed (SIGKILL, power)


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
    clear_stale_temps(path)
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


def clear_stale_temps(path: Path) -> list[Path]:
    """Remove the temp files a killed write of `path` left beside it: named as write_text_atomic names them
    (`.<name>.<mkstemp's 8 characters>.tmp`), regular files (never a link), the user's own, mode 0600, untouched for
    STALE_TEMP_S (a write in flight elsewhere keeps its own). Returns what it removed."""
    pattern = re.compile(re.escape(f".{path.name[:TEMP_STEM_CHARS]}.") + r"[a-z0-9_]{8}\.tmp")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            stale = time.time() - info.st_mtime > STALE_TEMP_S
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o600 and stale:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed
