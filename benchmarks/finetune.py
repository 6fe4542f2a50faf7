"""What continued pre-training and ``objreg finetune`` cost on all-MiniLM-L6-v2, by part.

    python -m benchmarks.finetune [--quick] [--json] [--threads N] [--device cpu]

One seed of the ``tapt`` experiment's SST-2 arm at its full sizes (``--quick``: its quick sizes):
the split, MLM continued pre-training (CPU seconds per step), and one ``objreg finetune`` of the
adapted model split into its linear probe, its training steps (per step) and its scoring. CPU
seconds are this process's (all threads); on a shared machine read them, not wall seconds.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import objreg
from benchmarks.common import apply_threads, base_parser, emit, machine
from objreg.analysis.parallel.devices import resolve_device
from objreg.experiments import _support, tapt
from objreg.toolkit.splits import split_classification_file


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0], threads_default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(args.threads)
    device = resolve_device(args.device)
    config = tapt.QUICK if args.quick else tapt.FULL
    registry = objreg.Registry.load()
    clock: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        source = _support.shared_data() / tapt.TASKS["sst2"]
        if config.rows:
            lines = source.read_text(encoding="utf-8").split("\n")
            source = Path(scratch) / "sst2.tsv"
            source.write_text("\n".join(lines[:config.rows + 1]) + "\n", encoding="utf-8")
        files = split_classification_file(source, scratch, held_out=config.held_out)
        cpu = time.process_time()
        adapted, _ = tapt.continue_pretraining(tapt._model(), files.text, config, 0, device, Path(scratch) / "tapt",
                                               registry)
        clock["pretraining_cpu_s"] = time.process_time() - cpu
        stages: list[tuple[str, float]] = []
        report = objreg.finetune(str(adapted), "classification", str(files.train), eval_data=str(files.heldout),
                                 schedule=objreg.FineTuneSchedule(epochs=config.epochs, lr=config.finetune_lr),
                                 seq_len=config.seq_len, device=str(device), registry=registry,
                                 on_status=lambda line: stages.append((line, time.process_time())))
        ended = time.process_time()
    probe_started = next(at for line, at in stages if line.endswith("the linear probe"))
    training_started = next(at for line, at in stages if "fine-tuning on" in line)
    steps = report.units[0]["train_loss"]["steps"]
    result = {
        "machine": machine(device),
        "setting": "quick" if args.quick else "full",
        "rows": {"train": files.train_rows, "heldout": files.heldout_rows},
        "pretraining": {"steps": config.tapt_steps, "cpu_s": clock["pretraining_cpu_s"],
                        "cpu_s_per_step": clock["pretraining_cpu_s"] / config.tapt_steps},
        "finetune": {"cpu_s": report.timing["cpu_s"], "probe_cpu_s": training_started - probe_started,
                     "training_and_scoring_cpu_s": ended - training_started, "steps": steps,
                     "cpu_s_per_step": (ended - training_started) / steps},
    }
    emit(result, args.json, [("MLM step (CPU s)", result["pretraining"]["cpu_s_per_step"]),
                             ("fine-tune, whole (CPU s)", result["finetune"]["cpu_s"]),
                             ("  linear probe (CPU s)", result["finetune"]["probe_cpu_s"]),
                             ("  per training step, scoring included (CPU s)", result["finetune"]["cpu_s_per_step"])])
    return result


if __name__ == "__main__":
    main()
