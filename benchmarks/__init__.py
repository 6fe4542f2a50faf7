"""objreg's performance harness (DESIGN §7), run by hand, never collected by pytest.

    python -m benchmarks.alignment --quick --json   # per-sample alignment vs one forward+backward
    python -m benchmarks.curvature --quick --json   # HVP and the S matrix vs one gradient
    python -m benchmarks.corruption --json          # mlm / t5 corruption vs the Hugging Face collators
    python -m benchmarks.analyze --json             # wall time of the default `objreg analyze`
    python -m benchmarks --quick --json             # all of the above, one JSON object

Every figure is a ratio measured in one process with the paths interleaved round by round (the
machines are shared and noisy), reported as medians of repeated runs, beside a description of the
machine. docs/performance.md explains the methods and records the figures.
"""
