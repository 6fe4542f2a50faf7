"""Files that carry their own checksum: a damaged checkpoint is refused, never loaded.

A sealed file is one header line and the payload::

    OBJREG-SEALED sha256=<64 hex digits> bytes=<payload length>\\n<payload>

The header names the payload's length and SHA-256, so any flipped, lost or added byte anywhere
in the file (header included) is caught before the payload is parsed. It is written through
:func:`objreg.toolkit.atomic.atomic_file` (a synced temporary file and an atomic rename), so the
file is the previous version or the new one, whole. The payload is handed over as bytes, which
keeps both halves easy to test: :func:`seal` and :func:`unseal` are pure, and a test can damage
a file at any offset and expect :class:`ChecksumError`.

A checkpoint is many times the model, so it is never held as bytes: :func:`write_sealed_stream`
has the payload written straight into the file, hashed on its way there, and
:func:`read_sealed_stream` verifies the file by reading it in blocks before handing the payload
to its reader as a file. The header comes first but names the payload's length and digest, so
the writer serialises twice: once into a counter (the length, hence the header's size; nothing
kept), then into the file behind room for the header, which is written last. Memory stays at one
block of the payload beside the state being saved, instead of three copies of the payload.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from objreg.core.errors import DataError
from objreg.toolkit.atomic import atomic_file

T = TypeVar("T")
MAGIC = b"OBJREG-SEALED"
#: Bytes read at a time while a sealed file is verified.
BLOCK = 1 << 22
_HEADER = re.compile(rb"OBJREG-SEALED sha256=([0-9a-f]{64}) bytes=(0|[1-9][0-9]{0,15})\n")


class ChecksumError(DataError):
    """A sealed file whose bytes are not the ones written (or not a sealed file at all)."""


def _header(digest: str, length: int) -> bytes:
    return b"%s sha256=%s bytes=%d\n" % (MAGIC, digest.encode(), length)


def seal(payload: bytes) -> bytes:
    """``payload`` behind its header line."""
    return _header(hashlib.sha256(payload).hexdigest(), len(payload)) + payload


def unseal(data: bytes, what: str) -> bytes:
    """The payload of sealed ``data``; ``what`` names the file in errors.

    Raises:
        ChecksumError: no header, a length or a checksum that does not match.
    """
    match = _HEADER.match(data[:128])
    if match is None:
        if not data.startswith(MAGIC):
            raise ChecksumError(f"{what} is not a checksummed objreg file (no {MAGIC.decode()} header)")
        raise ChecksumError(f"{what} is damaged: its checksum header is unreadable")
    payload = data[match.end():]
    length = int(match.group(2))
    if len(payload) != length:
        raise ChecksumError(f"{what} is damaged: it holds {len(payload):,} bytes after its header, not {length:,} "
                            f"(truncated or appended to)")
    if hashlib.sha256(payload).hexdigest().encode() != match.group(1):
        raise ChecksumError(f"{what} is damaged: its SHA-256 checksum does not match its content")
    return payload


def write_sealed(path: Path, payload: bytes) -> None:
    """Write ``payload`` sealed to ``path``, atomically."""
    with atomic_file(Path(path)) as f:
        f.write(seal(payload))


def read_sealed(path: Path, what: str | None = None) -> bytes:
    """The verified payload of the sealed file ``path``.

    Raises:
        ChecksumError: see :func:`unseal`.
        OSError: the file cannot be read.
    """
    return unseal(Path(path).read_bytes(), what or str(path))


class _Counter(io.RawIOBase):
    """A write-only sink that counts the bytes written to it and keeps none."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.length += size
        return size


class _Hashing(_Counter):
    """Writes through to ``target``, hashing and counting on the way."""

    def __init__(self, target: IO[bytes]):
        super().__init__()
        self.target = target
        self.digest = hashlib.sha256()
        #: The error the file's write raised (torch's writer reports it as its own RuntimeError,
        #: without the errno that says "no space left" or "file too large").
        self.failed: OSError | None = None

    def write(self, data: Any) -> int:
        self.digest.update(data)
        try:
            self.target.write(data)
        except OSError as error:
            self.failed = error
            raise
        return super().write(data)


def write_sealed_stream(path: Path, save: Callable[[IO[bytes]], None]) -> int:
    """Write a sealed file whose payload ``save(file)`` writes, atomically, hashed while it
    streams to disk (module docstring); ``save`` must write the same bytes each time it is
    called. Returns the payload's length.

    Raises:
        RuntimeError: ``save`` wrote different lengths on its two calls.
    """
    counter = _Counter()
    save(counter)
    room = len(_header("0" * 64, counter.length))
    with atomic_file(Path(path)) as f:
        f.write(b"\0" * room)
        sink = _Hashing(f)
        try:
            save(sink)
        except Exception as error:
            if sink.failed is not None and sink.failed is not error:
                raise sink.failed from error  # the file's own error (a full disk), not the writer's wrapping
            raise
        if sink.length != counter.length:
            raise RuntimeError(f"the payload of {path} changed between its two serialisations "
                               f"({counter.length:,} and {sink.length:,} bytes)")
        f.seek(0)
        f.write(_header(sink.digest.hexdigest(), sink.length))
    return sink.length


class _Window(io.RawIOBase):
    """The part of an open file from ``start`` to its end, as a file of its own (seekable)."""

    def __init__(self, file: IO[bytes], start: int):
        super().__init__()
        self.file, self.start = file, start
        self.file.seek(start)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.file.readinto(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            offset += self.start
        return self.file.seek(offset, whence) - self.start

    def tell(self) -> int:
        return self.file.tell() - self.start


def read_sealed_stream(path: Path, load: Callable[[IO[bytes]], T], what: str | None = None) -> T:
    """``load(file)`` of the payload of the sealed file ``path``, once every byte of it is
    verified (read in blocks of :data:`BLOCK`: never held whole).

    Raises:
        ChecksumError: as :func:`unseal`.
        OSError: the file cannot be read.
    """
    what = what or str(path)
    with open(path, "rb") as f:
        match = _HEADER.match(f.read(128))
        if match is None:
            f.seek(0)
            start = f.read(len(MAGIC))
            if start != MAGIC:
                raise ChecksumError(f"{what} is not a checksummed objreg file (no {MAGIC.decode()} header)")
            raise ChecksumError(f"{what} is damaged: its checksum header is unreadable")
        length, size = int(match.group(2)), os.fstat(f.fileno()).st_size - match.end()
        if size != length:
            raise ChecksumError(f"{what} is damaged: it holds {size:,} bytes after its header, not {length:,} "
                                f"(truncated or appended to)")
        digest = hashlib.sha256()
        f.seek(match.end())
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
        if digest.hexdigest().encode() != match.group(1):
            raise ChecksumError(f"{what} is damaged: its SHA-256 checksum does not match its content")
        return load(io.BufferedReader(_Window(f, match.end()), BLOCK))
