"""Scaling with the row length and the batch: time and peak memory per batch of corruption, attention
building and one training step, objreg beside its references, for T from 512 to 8,192.

    python -m benchmarks.scaling --json --plot docs/performance-scaling.png

Rows are the default corpus' token ids concatenated and cut to length (HF's ``group_texts``: full
rows, one document each, no padding), ids only on both sides.

* **corruption** (``--objectives``, default ``mlm,clm,t5``) at ``--batch-size`` for every ``T`` of
  ``--seq-lens``, and at every ``B`` of ``--batch-sizes`` for the first ``T``: ``assemble`` +
  ``corrupt`` against the reference collator of ``benchmarks.corruption`` (HF's MLM collator,
  its ``mlm=False`` twin, HF's T5 span-corruption collator);
* **attention** at ``--batch-size``: what a training pass needs from the corrupted batch. objreg's
  structured path: ``objective.attention(batch)`` (an ``AttentionMask``) and the backbone's
  ``prepare_attention`` of it (the fused-attention plan); the dense path:
  ``objective.attention_mask(batch)`` (bool ``[B, T, T]``) and its additive bias
  (``[B, 1, T, T]`` floats) that the ``math`` attention adds to the scores. Also as a share of
  the objective's corruption time at the same shape;
* **training step** at ``--train-batch-size`` (default 1): one SGD step (forward, backward, update)
  of the ``default`` model (hidden 128, 2 layers, 4 heads) with ``max_positions`` raised to the
  row, through ``objective.losses`` with the structured mask against the dense one. The dense
  step is skipped where its ``[B, heads, T, T]`` scores alone would pass ``--dense-limit-gib``.

Times are medians of ``--repeats`` rounds, the paths of one point interleaved. Peak memory is
measured in one child process started with glibc serving every allocation of 64 KiB or more by
``mmap`` (so freed tensors leave the resident set at once): per path one warm-up run, then the
resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) above the
resident set before the run. ``--no-memory`` skips it. ``--plot PATH`` writes the figure
(time and memory against ``T``, log-log).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import objreg
from benchmarks.common import (
    MEMORY_ENV,
    REPO,
    _status_mib,
    apply_threads,
    base_parser,
    emit,
    interleaved,
    keep_freed_memory,
    machine,
    rounded,
)
from benchmarks.corruption import Row, hf_tokenizer
from benchmarks.references import HFT5SpanCorruption, compute_input_and_target_lengths

SEQ_LENS = (512, 1024, 2048, 4096, 8192)
REFERENCES = {"mlm": "HF collator", "clm": "HF collator (mlm=False)", "t5": "HF T5 collator"}
BATCH_SIZES = (32, 128, 256, 512)


# -- the rows ---------------------------------------------------------------------------------------


class Workload:
    """Token-id rows of any length from the default corpus, the objectives, and their references."""

    def __init__(self) -> None:
        self.registry = objreg.Registry.load()
        corpus = self.registry.load_corpus("default", objreg.cache_dir())
        self.tokenizer = self.registry.load_tokenizer("default", corpus, objreg.cache_dir())
        chunks = objreg.TokenizedCorpus(self.tokenizer, corpus, 128).chunks
        self.stream = [i for c in chunks for ids, _ in c.sentences for i in ids]
        self.vocab = self.tokenizer.vocab

    def rows(self, count: int, length: int, offset: int = 0) -> list[list[int]]:
        """``count`` rows of ``length`` ids cut from the concatenated corpus (cycled)."""
        needed = (offset + count) * length
        stream = self.stream * (needed // len(self.stream) + 1)
        return [stream[(offset + r) * length : (offset + r + 1) * length] for r in range(count)]

    def case(self, name: str, B: int, T: int) -> tuple[list[Row], int, Any, Callable[[Any], Any]]:
        """objreg's rows and ``seq_len``, the reference's examples and the reference, for one batch."""
        v = self.vocab
        if name == "t5":
            expanded, target_length = compute_input_and_target_lengths(T, 0.15, 3.0)
            ids = self.rows(B, expanded)
            eos = v.named_ids.get("[EOS]", v.sep_id)
            reference = HFT5SpanCorruption(v.size, eos, v.pad_id, 0.15, 3.0, T, target_length)
            return [Row(b, ((r, None),)) for b, r in enumerate(ids)], expanded + 2, [{"input_ids": r} for r in ids], \
                reference
        from transformers import DataCollatorForLanguageModeling

        ids = self.rows(B, T - 2)
        collator = DataCollatorForLanguageModeling(hf_tokenizer(self.tokenizer), mlm=(name == "mlm"),
                                                   mlm_probability=0.15)
        examples = [{"input_ids": [v.cls_id, *r, v.sep_id]} for r in ids]
        return [Row(b, ((r, None),)) for b, r in enumerate(ids)], T, examples, collator


# -- the paths of each point ------------------------------------------------------------------------


def corruption_paths(w: Workload, name: str, B: int, T: int) -> dict[str, Callable[[], Any]]:
    rows, seq_len, examples, reference = w.case(name, B, T)
    objective = w.registry.get(name, vocab=w.vocab)
    generator = torch.Generator().manual_seed(0)
    return {
        "objreg": lambda: objective.corrupt(w.tokenizer.assemble(rows, seq_len), generator),
        "reference": lambda: reference(examples),
    }


def attention_paths(w: Workload, name: str, B: int, T: int) -> dict[str, Callable[[], Any]]:
    from objreg.toolkit.layers import attention_bias, prepare_attention

    rows, seq_len, _, _ = w.case(name, B, T)
    objective = w.registry.get(name, vocab=w.vocab)
    generator = torch.Generator().manual_seed(0)
    batch = objective.corrupt(w.tokenizer.assemble(rows, seq_len), generator)
    assembled = w.tokenizer.assemble(rows, seq_len)
    return {
        "structured": lambda: objective.attention(batch),
        "structured_plan": lambda: prepare_attention(objective.attention(batch), torch.float32),
        "dense": lambda: objective.attention_mask(batch),
        "dense_bias": lambda: attention_bias(objective.attention_mask(batch), torch.float32),
        "corrupt": lambda: objective.corrupt(assembled, generator),
        "corruption": lambda: objective.corrupt(w.tokenizer.assemble(rows, seq_len), generator),
    }


def training_paths(w: Workload, name: str, B: int, T: int, dense_limit_gib: float) -> dict[str, Callable[[], Any]]:
    from objreg.analysis.run.prepare import build_model

    rows, seq_len, _, _ = w.case(name, B, T)
    objective = w.registry.get(name, vocab=w.vocab)
    batch = objective.corrupt(w.tokenizer.assemble(rows, seq_len), torch.Generator().manual_seed(0))
    width = batch.input_ids.shape[1]
    model = build_model(w.registry, "default", w.vocab, {name: objective.info.heads}, 0,
                        config={"max_positions": width})
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    heads = model.backbone.blocks[0].attention.num_heads

    def step(mask: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        objective.losses(model, batch, mask).mean().backward()
        optimizer.step()

    paths: dict[str, Callable[[], Any]] = {"structured": lambda: step(objective.attention(batch))}
    if B * heads * width * width * 4 / 2**30 <= dense_limit_gib:
        paths["dense"] = lambda: step(objective.attention_mask(batch))
    return paths


def points(args: Any) -> list[tuple[str, str, int, int]]:
    """Every (part, objective, B, T) the run measures."""
    names = [n.strip() for n in args.objectives.split(",") if n.strip()]
    out = []
    for name in names:
        out += [("corruption", name, args.batch_size, T) for T in args.seq_lens]
        out += [("corruption", name, B, args.seq_lens[0]) for B in args.batch_sizes if B != args.batch_size]
    out += [("attention", n, args.batch_size, T) for n in names if n in ("mlm", "clm") for T in args.seq_lens]
    out += [("training", n, args.train_batch_size, T) for n in names for T in args.seq_lens]
    return out


def paths_of(w: Workload, point: tuple[str, str, int, int], args: Any) -> dict[str, Callable[[], Any]]:
    part, name, B, T = point
    if part == "corruption":
        return corruption_paths(w, name, B, T)
    if part == "attention":
        paths = attention_paths(w, name, B, T)
        if B * T * T * 5 / 2**30 > args.dense_limit_gib:  # the bool mask and its float bias
            del paths["dense_bias"]
        if B * T * T / 2**30 > args.dense_limit_gib:
            del paths["dense"]
        return paths
    return training_paths(w, name, B, T, args.dense_limit_gib)


def key(point: tuple[str, str, int, int]) -> str:
    part, name, B, T = point
    return f"{part}/{name}/B{B}/T{T}"


# -- memory, in a child process ---------------------------------------------------------------------


def measure_memory(args: Any) -> dict[str, dict[str, float]]:
    """Run this module with ``--memory-child`` under the memory environment; one JSON line per point."""
    argv = [a for a in (sys.argv[1:] if args.argv is None else args.argv) if a != "--json"]
    env = {**os.environ, **MEMORY_ENV}
    done = subprocess.run([sys.executable, "-m", "benchmarks.scaling", *strip_plot(argv), "--memory-child"],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed:\n{done.stderr[-3000:]}")
    out: dict[str, dict[str, float]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            out[record["point"]] = record["mib"]
    return out


def strip_plot(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--plot":
            skip = True
            continue
        out.append(a)
    return out


def memory_child(w: Workload, args: Any) -> None:
    for point in points(args):
        mib = {}
        for name, path in paths_of(w, point, args).items():
            path()  # warm-up
            Path("/proc/self/clear_refs").write_text("5")
            before = _status_mib("VmRSS")
            path()
            mib[name] = round(_status_mib("VmHWM") - before, 2)
        print(json.dumps({"point": key(point), "mib": mib}), flush=True)


# -- the plot ---------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = (("corruption", "corruption per batch (assemble + corrupt)", ("objreg", "reference")),
              ("attention", "attention for one pass", ("structured", "structured_plan", "dense", "dense_bias")),
              ("training", "one training step (default model)", ("structured", "dense")))
    colors = {"mlm": "C0", "clm": "C1", "t5": "C2"}
    styles = {"objreg": "-", "structured": "-", "structured_plan": "-.", "reference": "--", "dense": "--",
              "dense_bias": ":"}
    for column, (part, title, sides) in enumerate(panels):
        for row, (measure, unit) in enumerate((("ms", "ms per batch"), ("mib", "peak MiB per batch"))):
            ax = axes[row, column]
            for name, series in result["series"].get(part, {}).items():
                for side in sides:
                    xs = [p["T"] for p in series if side in p.get(measure, {})]
                    floor = 1e-2 if measure == "mib" else 1e-3  # below the resolution: drawn at the floor
                    ys = [max(p[measure][side], floor) for p in series if side in p.get(measure, {})]
                    if xs:
                        label = f"{name} {REFERENCES.get(name, 'reference') if side == 'reference' else side}"
                        ax.plot(xs, ys, styles[side], marker="o", label=label, color=colors.get(name, "C3"))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("T (tokens per row)")
            ax.set_ylabel(unit)
            batch = result["config"]["train_batch_size" if part == "training" else "batch_size"]
            ax.set_title(f"{title}, B={batch}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    figure.suptitle(f"objreg scaling with T, one CPU thread ({result['machine']['cpu']}; "
                    f"{result['config']['allocator']} for the times)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- the benchmark ----------------------------------------------------------------------------------


def integers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=1)
    parser.add_argument("--objectives", default="mlm,clm,t5")
    parser.add_argument("--seq-lens", type=integers, default=SEQ_LENS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batch-sizes", type=integers, default=BATCH_SIZES, help="the B sweep at the first T")
    parser.add_argument("--train-batch-size", type=int, default=1)
    parser.add_argument("--dense-limit-gib", type=float, default=4.0,
                        help="skip a dense path whose [B, T, T] tensors would pass this")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="glibc keeps freed memory for the timings (benchmarks.common.keep_freed_memory)")
    parser.add_argument("--plot", default=None, help="write the figure here (PNG)")
    parser.add_argument("--memory-child", action="store_true", help=argparse_hidden())
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.argv = argv
    apply_threads(args.threads)
    torch.manual_seed(0)
    np.random.seed(0)
    w = Workload()
    if args.memory_child:
        memory_child(w, args)
        return {}
    kept = keep_freed_memory() if args.keep_freed_memory else False
    repeats = args.repeats or 3
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "machine": machine(torch.device("cpu")),
        "config": {"objectives": args.objectives, "seq_lens": list(args.seq_lens), "batch_size": args.batch_size,
                   "batch_sizes": list(args.batch_sizes), "train_batch_size": args.train_batch_size,
                   "repeats": repeats, "dense_limit_gib": args.dense_limit_gib, "gpu": "none (CPU only)",
                   "allocator": "glibc, freed memory kept" if kept else "glibc defaults"},
        "points": {},
    }
    for point in points(args):
        paths = paths_of(w, point, args)
        times = interleaved(paths, repeats, torch.device("cpu"))
        result["points"][key(point)] = {"ms": {k: rounded(v * 1e3) for k, v in times.items()}}
        print(f"{key(point)}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items()), file=sys.stderr)
    if not args.no_memory:
        for name, mib in measure_memory(args).items():
            result["points"].setdefault(name, {})["mib"] = mib
        result["memory_method"] = ("VmHWM above VmRSS per path in one child process, glibc MALLOC_MMAP_THRESHOLD_="
                                   "65536, after one warm-up run")
    result["series"] = series(result["points"], args)
    result["done_when"] = done_when(result["points"], args)
    if args.plot:
        plot(result, args.plot)
        result["plot"] = args.plot
    rows = [(f"{p}.{m}.{k}", v) for p, r in result["points"].items() for m in ("ms", "mib") for k, v in
            r.get(m, {}).items()]
    rows += [(f"done_when.{k}", v) for k, v in result["done_when"].items()]
    emit(result, args.json, rows)
    return result


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def series(points_: dict[str, Any], args: Any) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The points against T at the fixed batch sizes, per part and objective (for the plot)."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for k, record in points_.items():
        part, name, B, T = k.split("/")
        fixed = args.train_batch_size if part == "training" else args.batch_size
        if int(B[1:]) != fixed:
            continue
        out.setdefault(part, {}).setdefault(name, []).append({"T": int(T[1:]), **record})
    for part in out.values():
        for name in part:
            part[name].sort(key=lambda p: p["T"])
    return out


def done_when(points_: dict[str, Any], args: Any) -> dict[str, Any]:
    """The issue's figures: attention building as a share of corruption at B=batch_size, and whether
    the attention's memory grows like T (ratio of the largest T's memory to the smallest's)."""
    out: dict[str, Any] = {}
    for name in ("mlm", "clm"):
        for T in args.seq_lens:
            record = points_.get(f"attention/{name}/B{args.batch_size}/T{T}")
            if not record:
                continue
            ms = record["ms"]
            for path in ("structured", "structured_plan", "dense", "dense_bias"):
                if path in ms:
                    out[f"{name}_T{T}_{path}_share_of_corrupt"] = rounded(ms[path] / ms["corrupt"])
                    out[f"{name}_T{T}_{path}_share_of_assemble_and_corrupt"] = rounded(ms[path] / ms["corruption"])
    return out


if __name__ == "__main__":
    main()
