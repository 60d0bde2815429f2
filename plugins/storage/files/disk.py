"""walkit.plugins.storage.files.disk holds what the journal, entry logs and index share about files.

Files are numbered with fixed-width hexadecimal names (``0000000000000001.journal``,
``00000001.log``, ``000000000000002a.idx``); `numbered_files` lists them, ignoring any other
name. `fsync_dir` makes created, renamed and removed names durable; `fsync_all` makes files and names durable;
`write_durably` replaces a small file whole (written beside it, fsynced, renamed over it);
`punch_hole` gives a range of a file back to the file system (Linux fallocate, where it can).
"""

from __future__ import annotations

import ctypes
import os

_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2


def _fallocate():
    """_fallocate is libc's fallocate (64-bit offsets), or None where there is none (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


_FALLOCATE = _fallocate()


def numbered_files(folder: str, ext: str, digits: int) -> list[tuple[int, str]]:
    """numbered_files lists (number, path) of the files named `<digits hex digits>.<ext>` in `folder`, sorted."""
    found = []
    for name in os.listdir(folder):
        stem, _, suffix = name.partition(".")
        if suffix != ext or len(stem) != digits:
            continue
        try:
            found.append((int(stem, 16), os.path.join(folder, name)))
        except ValueError:
            continue
    return sorted(found)


def numbered_path(folder: str, number: int, ext: str, digits: int) -> str:
    """numbered_path names file `number` in `folder` the way `numbered_files` finds it."""
    return os.path.join(folder, f"{number:0{digits}x}.{ext}")


def fsync_dir(folder: str) -> None:
    """fsync_dir makes the names created, renamed or removed in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(paths: list[str], folders: list[str]) -> None:
    """fsync_all fsyncs the files at `paths` (one descriptor open at a time; a file gone meanwhile is skipped), then `folders`."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in folders:
        fsync_dir(folder)


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """punch_hole frees `length` bytes of the file at `offset` (they read as zeros; its size stays).

    It returns False where the system or file system cannot (the bytes then stay as they were):
    callers use it to give space back, never to change what the file means.
    """
    if _FALLOCATE is None or length <= 0:
        return False
    return _FALLOCATE(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0


def write_durably(path: str, data: bytes) -> None:
    """write_durably replaces the file at `path` with `data`, durably: a crash leaves the old or the new bytes."""
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
