"""Files that carry their own checksum: a damaged checkpoint is refused, never loaded.

A sealed file is one header line and the payload::

    OBJREG-SEALED sha256=<64 hex digits> bytes=<payload length>\\n<payload>

The header names the payload's length and SHA-256, so any flipped, lost or added byte anywhere
in the file (header included) is caught before the payload is parsed. It is written through
:func:`objreg.toolkit.atomic.atomic_file` (a synced temporary file and an atomic rename), so the
file is the previous version or the new one, whole. The payload is handed over as bytes, which
keeps both halves easy to test: :func:`seal` and :func:`unseal` are pure, and a test can damage
a file at any offset and expect :class:`ChecksumError`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from objreg.core.errors import DataError
from objreg.toolkit.atomic import atomic_file

MAGIC = b"OBJREG-SEALED"
_HEADER = re.compile(rb"OBJREG-SEALED sha256=([0-9a-f]{64}) bytes=(0|[1-9][0-9]{0,15})\n")


class ChecksumError(DataError):
    """A sealed file whose bytes are not the ones written (or not a sealed file at all)."""


def seal(payload: bytes) -> bytes:
    """``payload`` behind its header line."""
    digest = hashlib.sha256(payload).hexdigest()
    return b"%s sha256=%s bytes=%d\n" % (MAGIC, digest.encode(), len(payload)) + payload


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
