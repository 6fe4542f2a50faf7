"""A full disk, a quota or a file-size limit met while ``checkpoint.pt`` streams to disk: the file's
own error comes out (not torch's ``inline_container.cc`` wrapping of it), becomes the one line
that names it, and the previous checkpoint stays whole."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from objreg.analysis.run import checksum
from objreg.analysis.run.failures import describe
from objreg.analysis.run.resume import CHECKPOINT, save_checkpoint

STATE = {"weights": torch.arange(40_000, dtype=torch.float64), "step": 3}


class Limited:
    """A file that fails with ``code`` once ``limit`` bytes were written to it."""

    def __init__(self, file, limit, code):
        self.file, self.limit, self.code, self.written = file, limit, code, 0

    def write(self, data):
        size = memoryview(data).nbytes
        if self.written + size > self.limit:
            raise OSError(self.code, os.strerror(self.code))
        self.written += size
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def limited(limit, code):
    real = checksum.atomic_file

    @contextlib.contextmanager
    def atomic_file(path, mode="wb"):
        with real(path, mode) as f:
            yield Limited(f, limit, code)

    return atomic_file


CASES = {
    "no space, in the payload": (10_000, errno.ENOSPC, "no space left on the device writing"),
    "no space, at the first byte": (0, errno.ENOSPC, "no space left on the device writing"),
    "no space, near the end": (300_000, errno.ENOSPC, "no space left on the device writing"),
    "quota": (50_000, errno.EDQUOT, "no space left on the device writing"),
    "file-size limit": (10_000, errno.EFBIG, "file too large writing"),
    "input/output error": (10_000, errno.EIO, "input/output error at"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_failed_write_is_the_files_own_error_and_the_old_checkpoint_stays(tmp_path, monkeypatch, case):
    limit, code, line = CASES[case]
    save_checkpoint(tmp_path, {"old": True})
    before = (tmp_path / CHECKPOINT).read_bytes()
    monkeypatch.setattr(checksum, "atomic_file", limited(limit, code))
    with pytest.raises(OSError) as error:
        save_checkpoint(tmp_path, STATE)
    assert error.value.errno == code
    message = str(describe(error.value, tmp_path))
    assert message.startswith(line) and CHECKPOINT in message and "\n" not in message
    assert "inline_container" not in message
    assert (tmp_path / CHECKPOINT).read_bytes() == before  # the previous checkpoint, whole
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # no temporary left behind


def test_a_real_file_size_limit_gives_the_file_too_large_line(tmp_path):
    script = textwrap.dedent(f"""
        import resource, torch
        from objreg.analysis.run.failures import describe
        from objreg.analysis.run.resume import save_checkpoint
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            save_checkpoint({str(tmp_path)!r}, {{"w": torch.zeros(200_000, dtype=torch.float64)}})
        except OSError as error:
            print(describe(error, {str(tmp_path)!r}))
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("file too large writing") and "checkpoint.pt" in done.stdout
    assert list(tmp_path.iterdir()) == []
