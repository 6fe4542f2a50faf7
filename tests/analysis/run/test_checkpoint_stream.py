"""Checkpoints hashed while they stream to disk, verified block by block, and written only every
N-th step with ``checkpoint_every``."""

from __future__ import annotations

import hashlib
import io

import pytest
import torch

import objreg
from objreg.analysis.run import analyze as analyze_module
from objreg.analysis.run import checksum
from objreg.analysis.run.checksum import ChecksumError, read_sealed, read_sealed_stream, seal, write_sealed_stream


def _payload() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"w": torch.randn(300, 200, generator=generator), "steps": [1, 2, 3]}


def test_a_streamed_file_is_the_in_memory_seal_of_the_same_payload(tmp_path, monkeypatch):
    monkeypatch.setattr(checksum, "BLOCK", 4096)  # verification in many blocks
    state = _payload()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = tmp_path / "c.pt"
    size = write_sealed_stream(path, lambda f: torch.save(state, f))
    assert size == len(buffer.getvalue())
    assert path.read_bytes() == seal(buffer.getvalue())  # same header, digest and bytes
    assert hashlib.sha256(buffer.getvalue()).hexdigest() in path.read_bytes()[:128].decode("ascii", "replace")
    assert read_sealed(path) == buffer.getvalue()
    loaded = read_sealed_stream(path, lambda f: torch.load(f, weights_only=True))
    assert torch.equal(loaded["w"], state["w"]) and loaded["steps"] == [1, 2, 3]


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:-1], "truncated or appended to"),
    (lambda data: data[:-10] + bytes([data[-10] ^ 1]) + data[-9:], "checksum does not match"),
    (lambda data: b"junk" + data[4:], "not a checksummed objreg file"),
])
def test_a_damaged_stream_is_refused_before_it_is_loaded(tmp_path, damage, message):
    path = tmp_path / "c.pt"
    write_sealed_stream(path, lambda f: torch.save(_payload(), f))
    path.write_bytes(damage(path.read_bytes()))
    loads = []
    with pytest.raises(ChecksumError, match=message):
        read_sealed_stream(path, loads.append)
    assert loads == []


def test_a_payload_that_changes_between_its_two_serialisations_is_refused(tmp_path):
    calls = []

    def save(f):
        calls.append(1)
        f.write(b"x" * len(calls))

    with pytest.raises(RuntimeError, match="changed between its two serialisations"):
        write_sealed_stream(tmp_path / "c.pt", save)
    assert not (tmp_path / "c.pt").exists()  # atomic: nothing left behind


SMALL = dict(steps=3, batch_size=4, seq_len=48, eval_size=8, head_fit_size=32)


def test_checkpoint_every_writes_every_nth_step_and_the_last_and_changes_no_number(tmp_path, monkeypatch):
    written = []
    original = analyze_module.save_checkpoint

    def counting(out_dir, state):
        written.append(out_dir)
        return original(out_dir, state)

    monkeypatch.setattr(analyze_module, "save_checkpoint", counting)
    steps = []
    every_two = objreg.analyze("mlm,sop", "qa", **SMALL, out_dir=tmp_path / "a", checkpoint_every=2,
                               on_step=lambda s, r: steps.append((s, len(written))))
    # After step 1 (the 2nd) and step 2 (the last): not after step 0.
    assert steps == [(0, 0), (1, 1), (2, 2)]
    written.clear()
    each = objreg.analyze("mlm,sop", "qa", **SMALL, out_dir=tmp_path / "b")
    assert len(written) == 3
    assert every_two.to_json() == each.to_json()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_checkpoint_every_takes_a_positive_integer(tmp_path, value):
    with pytest.raises(objreg.InvalidParameterError, match="checkpoint_every must be a positive integer"):
        objreg.analyze("mlm,sop", "qa", **SMALL, out_dir=tmp_path / "a", checkpoint_every=value)
