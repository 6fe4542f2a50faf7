"""``python -m benchmarks [--quick] [--json]``: every benchmark, one JSON object (or tables).

Each part also runs on its own (``python -m benchmarks.alignment`` and so on) with more options.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from benchmarks import alignment, analyze, corruption, curvature, probe


def main() -> None:
    argv = sys.argv[1:]
    as_json = "--json" in argv
    shared = [a for a in argv if a in ("--quick", "--json")] + _option(argv, "--threads") + _option(argv, "--device")
    parts = {
        "alignment": lambda: alignment.main(shared),
        "curvature": lambda: curvature.main(shared),
        "corruption": lambda: corruption.main([a for a in shared if a != "--quick"]),
        "analyze": lambda: analyze.main([a for a in shared if a not in ("--quick", "--device")]),
        "probe": lambda: probe.main(shared),
    }
    results = {}
    for name, run in parts.items():
        if as_json:
            with contextlib.redirect_stdout(io.StringIO()):  # each part prints its own object
                results[name] = run()
        else:
            print(f"== {name} ==")
            results[name] = run()
    if as_json:
        print(json.dumps(results, default=str))


def _option(argv: list[str], name: str) -> list[str]:
    if name in argv and argv.index(name) + 1 < len(argv):
        return [name, argv[argv.index(name) + 1]]
    return []


if __name__ == "__main__":
    main()
