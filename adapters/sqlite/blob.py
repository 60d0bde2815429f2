"""walkit.adapters.sqlite.blob is sqlite3.Blob over an apsw blob: incremental reads of one BLOB value.

Writing a blob in place changes the file without a statement, so no Session sees it and it
would never reach the log: a blob of the replicated database reads only, and its writes raise
NotSupportedError (write the value with UPDATE). Blobs of TEMP and attached databases belong to
the connection alone and are writable, as in sqlite3.
"""

from __future__ import annotations

import os

from walkit.adapters.sqlite.errors import NotSupportedError, OperationalError, ProgrammingError, translate


class Blob:
    """Blob reads (and, outside the replicated database, writes) one BLOB value, as sqlite3.Blob does."""

    def __init__(self, connection, blob, *, writable: bool, replicated: bool) -> None:
        self._connection = connection
        self._blob = blob
        self._writable = writable
        self._replicated = replicated
        self._length = blob.length()
        self._offset = 0

    # -- file-like ------------------------------------------------------------------------------------
    def read(self, length: int = -1, /) -> bytes:
        """read returns up to `length` bytes from the current offset (all the rest if negative) and moves past them."""
        self._check()
        if length < 0 or length > self._length - self._offset:
            length = self._length - self._offset
        data = self._read_at(self._offset, length)
        self._offset += len(data)
        return data

    def write(self, data, /) -> None:
        """write writes `data` at the current offset: in the replicated database, NotSupportedError (use UPDATE)."""
        self._check()
        data = bytes(memoryview(data))
        if len(data) > self._length - self._offset:
            raise ValueError("data longer than blob length")
        self._write_at(self._offset, data)
        self._offset += len(data)

    def tell(self) -> int:
        """tell is the current offset."""
        self._check()
        return self._offset

    def seek(self, offset: int, origin: int = os.SEEK_SET, /) -> None:
        """seek moves the offset to `offset` from the start, the current offset or the end (`origin`)."""
        self._check()
        bases = {os.SEEK_SET: 0, os.SEEK_CUR: self._offset, os.SEEK_END: self._length}
        if origin not in bases:
            raise ValueError("'origin' should be os.SEEK_SET, os.SEEK_CUR, or os.SEEK_END")
        target = bases[origin] + offset
        if not 0 <= target <= self._length:
            raise ValueError("offset out of blob range")
        self._offset = target

    def close(self) -> None:
        """close ends the blob; using it afterwards raises ProgrammingError."""
        if self._blob is not None:
            self._blob.close()
            self._blob = None

    # -- sequence-like --------------------------------------------------------------------------------
    def __len__(self) -> int:
        self._check()
        return self._length

    def __getitem__(self, key):
        self._check()
        if isinstance(key, slice):
            start, stop, step = key.indices(self._length)
            if step > 0:
                return self._read_at(start, max(stop - start, 0))[::step]
            return self._read_at(0, self._length)[key]
        index = self._index(key)
        return self._read_at(index, 1)[0]

    def __setitem__(self, key, value) -> None:
        self._check()
        if isinstance(key, slice):
            start, stop, step = key.indices(self._length)
            data = bytes(memoryview(value))
            if len(data) != len(range(start, stop, step)):
                raise IndexError("Blob slice assignment is wrong size")
            if step == 1:
                self._write_at(start, data)
            else:
                whole = bytearray(self._read_at(0, self._length))
                whole[key] = data
                self._write_at(0, bytes(whole))
            return
        if not isinstance(value, int):
            raise TypeError(f"{type(value).__name__!r} object cannot be interpreted as an integer")
        if not 0 <= value <= 255:
            raise ValueError("byte must be in range(0, 256)")
        self._write_at(self._index(key), bytes([value]))

    def __enter__(self) -> "Blob":
        self._check()
        return self

    def __exit__(self, *exc) -> bool:
        self._check()
        self.close()
        return False

    # -- helpers --------------------------------------------------------------------------------------
    def _index(self, key) -> int:
        if not isinstance(key, int):
            raise TypeError("Blob indices must be integers")
        index = key + self._length if key < 0 else key
        if not 0 <= index < self._length:
            raise IndexError("Blob index out of range")
        return index

    def _read_at(self, offset: int, length: int) -> bytes:
        try:
            self._blob.seek(offset)
            return self._blob.read(length)
        except Exception as exc:  # noqa: BLE001 - apsw's errors become DB-API errors
            raise translate(exc) from None

    def _write_at(self, offset: int, data: bytes) -> None:
        if not self._writable:
            raise OperationalError("attempt to write a readonly database")
        if self._replicated:
            raise NotSupportedError("writing a blob of the replicated database in place would bypass the log; "
                                    "write the value with UPDATE")
        try:
            self._blob.seek(offset)
            self._blob.write(data)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from None

    def _check(self) -> None:
        if self._blob is None:
            raise ProgrammingError("Cannot operate on a closed blob.")
        self._connection._check()
