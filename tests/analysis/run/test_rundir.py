"""Run directories: the lock, fresh-run ownership, stale temporaries, sealed files, fingerprints."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import objreg
from objreg.analysis.run.checksum import ChecksumError, seal, unseal
from objreg.analysis.run.digests import documents_digest
from objreg.analysis.run.fingerprint import absolute_paths
from objreg.analysis.run.rundir import LOCK_FILE, claim
from objreg.toolkit.atomic import atomic_file, remove_stale_temporaries


def test_seal_round_trip_and_every_flipped_byte_is_caught():
    payload = bytes(range(256)) * 4
    sealed = seal(payload)
    assert unseal(sealed, "f") == payload
    for offset in range(0, len(sealed), 7):
        damaged = bytearray(sealed)
        damaged[offset] ^= 0x01
        with pytest.raises(ChecksumError):
            unseal(bytes(damaged), "f")
    with pytest.raises(ChecksumError, match="truncated"):
        unseal(sealed[:-1], "f")
    with pytest.raises(ChecksumError, match="not a checksummed"):
        unseal(payload, "f")


def test_claim_locks_against_another_process(tmp_path):
    run = tmp_path / "run"
    with claim(run, resume=False):
        code = textwrap.dedent(f"""
            import fcntl, os, sys
            fd = os.open({str(run / LOCK_FILE)!r}, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                sys.exit(3)
        """)
        assert subprocess.run([sys.executable, "-c", code]).returncode == 3
        with pytest.raises(objreg.InvalidParameterError, match="in use by another objreg run"):
            claim(run, resume=True)
    with claim(run, resume=True):  # released: free again
        pass


@pytest.mark.parametrize(("content", "shown"), [(b"486\n0\n", " (pid 486)"), (b"48600\n", " (pid 48600)"),
                                              (b"not a pid\n", "; wait")])
def test_the_holder_is_named_by_the_first_line_of_the_lock_file(tmp_path, content, shown):
    """A shorter pid written over a longer one without truncating (as a lock holder other than
    objreg may do) leaves a second line: the message names the first, on one line."""
    run = tmp_path / "run"
    run.mkdir()
    code = textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(run / LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, {content!r}, 0)
        print("locked", flush=True)
        sys.stdin.read()  # holds the lock until the test kills it (or ends: end of input)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(objreg.InvalidParameterError) as caught:
            claim(run, resume=True)
        assert "\n" not in str(caught.value) and f"in use by another objreg run{shown}" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()


def test_a_fresh_run_takes_over_a_run_that_finished_no_step(tmp_path):
    run = tmp_path / "run"
    with claim(run, resume=False):
        (run / "config.json").write_text("{}")
        (run / "steps.jsonl").write_text("")
    with claim(run, resume=False):
        pass
    (run / "checkpoint.pt").write_bytes(b"x")
    with pytest.raises(objreg.InvalidParameterError, match="--resume"):
        claim(run, resume=False)


def test_foreign_files_are_refused_before_anything_is_created(tmp_path):
    (tmp_path / "config.json").write_text('{"mine": 1}')
    with pytest.raises(objreg.InvalidParameterError, match="did not write"):
        claim(tmp_path, resume=False)
    assert not (tmp_path / LOCK_FILE).exists()


def test_stale_temporaries_of_the_run_files_are_removed(tmp_path):
    with atomic_file(tmp_path / "report.json", "w") as f:
        f.write("{}")
    (tmp_path / ".report.json.abc.tmp").write_text("half")
    (tmp_path / ".unrelated.abc.tmp").write_text("not ours")
    removed = remove_stale_temporaries(tmp_path, ["report.json"])
    assert [p.name for p in removed] == [".report.json.abc.tmp"]
    assert (tmp_path / ".unrelated.abc.tmp").exists()
    assert remove_stale_temporaries(tmp_path, older_than=3600) == []


def test_paths_become_absolute_but_registered_names_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text("a file that shadows nothing")
    (tmp_path / "c.txt").write_text("One sentence here. Another one there.")
    registry = objreg.Registry.load(load_entrypoints=False)
    config = objreg.AnalysisConfig(pretrain=("mlm",), corpus="c.txt")
    assert absolute_paths(config, registry).corpus == str(tmp_path / "c.txt")
    assert absolute_paths(objreg.AnalysisConfig(pretrain=("mlm",)), registry).corpus == "default"


def test_documents_digest_sees_boundaries():
    assert documents_digest([["a b", "c"]]) != documents_digest([["a b c"]])
    assert documents_digest([["a"], ["b"]]) != documents_digest([["a", "b"]])


def test_a_run_directory_holds_its_fingerprint_and_tokenizer(tmp_path):
    (tmp_path / "c.txt").write_text("\n\n".join(f"Document {i} starts here. It ends there." for i in range(60)))
    out = tmp_path / "run"
    objreg.analyze("mlm", "qa", steps=1, batch_size=2, seq_len=32, eval_size=4, head_fit_size=8,
                   corpus=str(tmp_path / "c.txt"), out_dir=out)
    record = json.loads((out / "run.json").read_text())
    assert record["config"] == json.loads((out / "config.json").read_text())
    assert set(record["inputs"]) >= {"corpus", "tokenizer", "tokenizer_layout", "downstream"}
    assert record["settings"]["corpus"] == str(tmp_path / "c.txt")
    assert record["plugins"]["mlm"] == "objreg (built-in)"
    assert (out / "tokenizer.json").is_file()
    # Finished: no lock file left behind, and the directory is still known as a finished run of objreg's.
    assert (out / "report.json").is_file() and not (out / LOCK_FILE).exists()
    with pytest.raises(objreg.InvalidParameterError, match="already holds a finished run"):
        claim(out, resume=False)
    with pytest.raises(objreg.InvalidParameterError, match="already finished"):
        objreg.analyze(resume=str(out))


def test_an_unfinished_run_keeps_its_lock_file_and_a_finished_one_removes_it(tmp_path):
    unfinished = claim(tmp_path / "a", resume=False)
    unfinished.release(finished=True)  # no report.json: not finished, whatever the caller says
    assert (tmp_path / "a" / LOCK_FILE).exists()
    done = claim(tmp_path / "b", resume=False)
    (tmp_path / "b" / "report.json").write_text("{}")
    done.release(finished=True)
    assert not (tmp_path / "b" / LOCK_FILE).exists()
    done.release(finished=True)  # twice: nothing more to do


def test_a_foreign_run_json_does_not_make_a_directory_objregs(tmp_path):
    (tmp_path / "run.json").write_text('{"runs": 3}')
    with pytest.raises(objreg.InvalidParameterError, match="did not write"):
        claim(tmp_path, resume=False)
