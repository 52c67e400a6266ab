"""specchat's cache folder ($SPECCHAT_CACHE, else ~/.cache/specchat) and what every artefact in it shares:
sha256 hashes (a source file's remembered per path, size and mtime), `.verified` marks that skip re-hashing an
unchanged file, recorded folders (a record of each file's size and sha256, and the check against it), stale
temporaries, the build lock, and built_once, the one way an artefact is built: found sound, else built under
its lock into a temporary renamed into place.

The build lock: one builder per cache artefact; a specchat that finds an artefact being built by another
waits for it. Two `python infer.py` started at once on a cold cache would otherwise both assemble, convert
and quantize the same models (twice the memory and time) and race to rename their results into place.
The lock is an advisory flock on a file in the cache's `locks/` folder, one per artefact; the kernel
releases it when its holder exits, killed or not, so a crashed builder never blocks the next start.

Privacy: the cache root is the user's alone. It is created 0700 (its folders too), and a root that is not
owned by the user, or that its group or others can write, is refused in one line: anyone who can write there
could plant stored weights, a converted checkpoint or a kernel `.so` that the next start loads, or a symlink
at a temporary's predictable name. Once the root is the user's and closed, no other user can reach below it.

Disk faults: a read that fails for the disk (EIO, EACCES, a read-only cache) or for memory is an error of one
line naming the path and the errno (disk_error), never a reason to delete a good file; only content found
wrong (DamagedFile: a size, checksum, parse or shape that is not what was written) is rebuilt. Finished
artefacts are fsynced, then renamed into place, then their folder is fsynced (replace_durably).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from specchat.errors import ModelLoadError
from specchat.progress import Progress, notify, report

try:
    import fcntl
except ImportError:  # not POSIX (Windows): builds are not serialised there
    fcntl = None

CHUNK = 8 << 20  # bytes per read while hashing
ROOM_ADVICE = "free some space, or set $SPECCHAT_CACHE to a folder on another disk, and start again"
ADVICE = {  # what to do about an errno met in the cache
    errno.ENOSPC: ROOM_ADVICE,
    errno.EDQUOT: ROOM_ADVICE,
    errno.EFBIG: ROOM_ADVICE,
    errno.EROFS: "the cache is read-only and lacks this: set $SPECCHAT_CACHE to a writable folder",
    errno.EACCES: "check the cache's permissions, or set $SPECCHAT_CACHE to a folder of your own",
    errno.EPERM: "check the cache's permissions, or set $SPECCHAT_CACHE to a folder of your own",
    errno.EIO: "the disk reports an I/O error: check it (dmesg) before starting again",
    errno.ENOMEM: "close other programs and start again",
}
OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")  # how Rust libraries (safetensors, tokenizers) spell an errno


class DiskError(ModelLoadError):
    """An I/O failure in the cache (a full disk, a read-only or unreadable cache, EIO), said in one line."""


class DamagedFile(ValueError):
    """A cache artefact's content is not what was written (size, checksum, format, shapes): rebuild it."""


def cache_dir() -> Path:
    """$SPECCHAT_CACHE, else the user's XDG cache directory / specchat. Where it exists it must be the
    user's own and closed to writers other than the user (ModelLoadError otherwise)."""
    env = os.environ.get("SPECCHAT_CACHE")
    root = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("specchat"))
    _check_root(root)
    return root


def _check_root(root: Path) -> None:
    """Refuse a cache root another user owns or that its group or others can write (see the module's note)."""
    try:
        info = root.stat()
    except FileNotFoundError:
        return
    except OSError as err:
        raise DiskError(disk_error(err, root, "read the cache folder")) from err
    if not stat.S_ISDIR(info.st_mode):
        raise ModelLoadError(f"the cache {root} is not a folder; set $SPECCHAT_CACHE to a folder of your own")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise ModelLoadError(
            f"the cache {root} belongs to user id {info.st_uid}, not to you; "
            f"set $SPECCHAT_CACHE to a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ModelLoadError(
            f"the cache {root} can be written by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"chmod 700 it, or set $SPECCHAT_CACHE to a folder of your own"
        )


def private_dir(folder: Path) -> Path:
    """Create `folder` mode 0700, and below the cache root each missing folder on the way (the root too);
    the root is checked, and closed to group and others (0700) where it was not yet."""
    root = cache_dir()
    with disk_errors(folder, "create the cache folder"):
        if not folder.is_relative_to(root):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            return folder
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=0o700, exist_ok=True)
        _check_root(root)  # again: a root someone else made between the first look and mkdir is refused
        if stat.S_IMODE(root.stat().st_mode) & 0o077:
            optional_write(lambda: root.chmod(0o700))  # a root from before this rule
        current = root
        for name in folder.relative_to(root).parts:
            current = current / name
            current.mkdir(mode=0o700, exist_ok=True)
    return folder


def disk_error(err: BaseException, path: Path, doing: str) -> str:
    """One line for an I/O failure: what could not be done, on which path, the errno, and what to do."""
    found = os_error(err)
    if found is None:  # MemoryError, or a failure of unknown kind: still one line, nothing deleted
        code, text = (errno.ENOMEM, "out of memory") if isinstance(err, MemoryError) else (None, str(err))
        where = path
    else:
        code, text, where = found.errno, found.strerror or str(found), found.filename or path
    name = errno.errorcode.get(code, "") if code is not None else type(err).__name__
    advice = ADVICE.get(code)
    line = f"cannot {doing} {where}: {name} ({text})" + (f"; {advice}" if advice else "")
    return " ".join(line.split())


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind `err`: itself, or one a Rust library reported as text ('... (os error 28)')."""
    if isinstance(err, OSError):
        return err
    found = OS_ERROR_TEXT.search(str(err))
    return OSError(int(found[1]), os.strerror(int(found[1]))) if found else None


@contextmanager
def disk_errors(path: Path, doing: str) -> Iterator[None]:
    """Turn an I/O failure inside into DiskError(disk_error(...)); anything else passes through."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as err:
        if os_error(err) is None:
            raise
        raise DiskError(disk_error(err, path, doing)) from err


def optional_write(action) -> bool:
    """Run an optional write (a stamp, a memo, a mode): False where the disk refuses it."""
    try:
        action()
    except (OSError, DiskError):
        return False
    return True


def is_verified(path: Path, size: int, sha256: str, progress: Progress | None = None) -> bool:
    """True when `path` holds exactly the expected bytes; a stamp skips re-hashing an unchanged file.
    Writing the stamp is optional: on a read-only or full cache the file is simply hashed again next time.
    An I/O error reading `path` or its stamp is raised (OSError): it says nothing about the content."""
    info = path.stat()
    if info.st_size != size:
        return False
    stamp = stamp_path(path)
    expected = f"{sha256} {size} {info.st_mtime_ns}"
    try:
        if stamp.read_text().strip() == expected:
            return True
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    if file_sha256(path, progress) != sha256:
        return False
    optional_write(lambda: stamp.write_text(expected + "\n"))
    return True


def remove_stale_temporaries(target: Path) -> None:
    """Delete `.{name}.{pid}.tmp` leftovers of `target` whose writing process no longer runs."""
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        pid = leftover.name[len(target.name) + 2 : -len(".tmp")]
        if pid.isdigit() and not _process_alive(int(pid)):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def mark_verified(path: Path, sha256: str, written: Path | None = None) -> None:
    """Record that `path`, as it stands now, holds bytes of this sha256 (is_verified will not re-hash);
    where the disk refuses the stamp, is_verified hashes the file instead. `written`: the temporary that a rename
    makes `path` (it keeps its size and mtime): the stamp is then true of `path` once the rename is done."""
    info = (written or path).stat()
    optional_write(lambda: stamp_path(path).write_text(f"{sha256} {info.st_size} {info.st_mtime_ns}\n"))


def sync_tree(path: Path) -> None:
    """fsync a file, or a folder: every file and folder in it, then the folder itself."""
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir() or child.is_file():
                sync_tree(child)
    fsync_one(path)


def fsync_one(path: Path) -> None:
    """fsync one file or folder (not what a folder holds); folders only where POSIX allows it."""
    if path.is_dir() and os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: Path, dest: Path) -> None:
    """Rename a finished temporary (file or folder) into place so that a power cut leaves the old state or
    the whole new one: its bytes are fsynced first, then the rename is, by fsyncing the folder it is in."""
    sync_tree(tmp)
    os.replace(tmp, dest)
    fsync_one(dest.parent)


@contextmanager
def into_place(target: Path) -> Iterator[Path]:
    """A temporary beside `target` to write (a file or a folder) in: its folder made private, the temporaries
    of dead processes removed first; renamed into place durably (replace_durably) when the block ends without
    an error, and removed either way, so nothing half-written is ever `target`."""
    private_dir(target.parent)
    remove_stale_temporaries(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    _remove(tmp)
    try:
        yield tmp
        if target.is_dir():  # an incomplete folder, if any (a file is replaced by the rename itself)
            shutil.rmtree(target, ignore_errors=True)
        replace_durably(tmp, target)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_synced(path: Path, text: str) -> None:
    """Write a small file (a record beside an artefact) and fsync it."""
    with path.open("w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    digest, done, total = hashlib.sha256(), 0, path.stat().st_size
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            report(progress, f"checking {path.name}", done / max(total, 1))
    return digest.hexdigest()


@contextmanager
def building(target: Path, what: str, progress: Progress | None = None) -> Iterator[None]:
    """Hold `target`'s build lock. When another process holds it, say so once and wait; the caller
    then checks again whether the artefact is still missing before building it."""
    private_dir(target.parent)
    if fcntl is None:
        yield
        return
    lock = _build_lock(target)
    with disk_errors(lock, "open the build lock"):
        handle = lock.open("a")
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report(progress, f"another specchat is building {what}; waiting for it to finish", None)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_lock(target: Path) -> Path:
    return private_dir(cache_dir() / "locks") / f"{target.parent.name}-{target.name}.lock"


def being_built(target: Path) -> bool:
    """Whether another process holds `target`'s build lock now (building() would wait for it)."""
    if fcntl is None:
        return False
    try:
        with _build_lock(target).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def remembered_sha256(path: Path, progress: Progress | None = None) -> str:
    """sha256 of a file outside the cache (a GGUF source), remembered per (path, size, mtime) in the cache's
    `hashes/` folder so it is hashed once; where the cache is read-only it is hashed again next time."""
    memo = cache_dir() / "hashes" / (hashlib.sha256(str(path).encode()).hexdigest()[:24] + ".txt")
    with disk_errors(path, "read"):
        info = path.stat()
        stamp = f"{info.st_size} {info.st_mtime_ns}"
        if memo.exists():
            saved_stamp, _, digest = memo.read_text().strip().rpartition(" ")
            if saved_stamp == stamp and len(digest) == 64:  # a memo cut short by a crash is not used
                return digest
        digest = file_sha256(path, progress)
    optional_write(lambda: _remember(memo, f"{stamp} {digest}\n"))
    return digest


def _remember(memo: Path, text: str) -> None:
    private_dir(memo.parent)
    memo.write_text(text)


def read_record(folder: Path, name: str) -> dict:
    """The JSON record `name` of a recorded folder (a finished conversion's specchat.json)."""
    return json.loads((folder / name).read_text())


def file_records(folder: Path) -> dict:
    """The "files" of a recorded folder's record: {name: {"bytes", "sha256"}} of every file written in it,
    each marked verified as it stands."""
    records = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        records[path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        mark_verified(path, records[path.name]["sha256"])
    return records


def folder_damage(folder: Path, record: str, reading: str, progress: Progress | None = None) -> str:
    """'' when a recorded folder is whole, else what is wrong with it: its record missing or not JSON, a
    recorded file missing or not at its size and sha256 (hashed once per change), or a safetensors file cut
    short (also checked for folders recorded before their files were). A failure to read (EIO, EACCES) is
    raised as DiskError (cannot `reading` `folder`): it is no sign of damage."""
    with disk_errors(folder, reading):
        try:
            files = read_record(folder, record).get("files", {})
        except (FileNotFoundError, ValueError, AttributeError):  # a record that is not a JSON table too
            return f"its {record} is unreadable"
        for name, written in files.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if not is_verified(path, written["bytes"], written["sha256"], progress):
                return f"{name} differs from what was written (size or sha256)"
        for path in folder.glob("*.safetensors"):
            if not safetensors_whole(path):
                return f"{path.name} is cut short"
        return ""


def safetensors_whole(path: Path) -> bool:
    """True when the file's header reads and its tensors end exactly at the end of the file; an I/O
    error other than the file being gone is raised (OSError)."""
    try:
        with path.open("rb") as src:
            length = int.from_bytes(src.read(8), "little")
            header = json.loads(src.read(length))
            size = os.fstat(src.fileno()).st_size
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        return size == 8 + length + max(ends, default=0)
    except (FileNotFoundError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


def built_once(
    target: Path,
    what: str,
    problem: Callable[[], str | None],
    write: Callable[[Path], None],
    writing: str,
    progress: Progress | None = None,
    remove_damaged: bool = True,
) -> bool:
    """Make `target` a sound artefact; whether it was built now. problem(): '' when `target` is sound, None
    when there is none, else what is wrong with it. Unless sound, under its build lock (building) it is looked
    at again (another process may have built it meanwhile); a damaged one is said in one notice line
    ("rebuilding `what`: ...") and removed (remove_damaged; else the rename replaces it); write(tmp) writes a
    new one into a temporary renamed into place (into_place). An I/O failure is a DiskError (cannot `writing`)."""
    if problem() == "":
        return False
    with building(target, what, progress):
        found = problem()
        if found == "":
            return False
        if found:
            notify(progress, f"rebuilding {what}: {found}")
            if remove_damaged:
                _remove(target)
        with disk_errors(target, writing), into_place(target) as tmp:
            write(tmp)
    return True
