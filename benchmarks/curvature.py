"""Hessian-vector products and the S matrix of two objectives vs one gradient of the downstream loss.

    python -m benchmarks.curvature --quick --json

``gradient_s``: one gradient of ``D`` (the downstream task's mean loss over ``--downstream-size``
examples). ``hvp_s``: ``H_D v`` for one direction (forward-over-reverse). ``s_matrix_s``:
``S_ij = g_iᵀ H_D g_j`` for the gradients of two pre-training objectives (mlm, sop), as the
analyzer computes it (``Curvature.gradient_and_products`` with both directions and method
``auto``, which also returns ``∇D``, then the dot products); ``s_matrix_auto_method`` names the
method ``auto`` chose on this device, and the two ``s_matrix_*_ratio`` rows time each method. The same computations are timed under ``torch.compile`` unless ``--no-compile``;
a failure to compile is reported, not hidden. Forward-over-forward (nested ``jvp``) is not offered:
it returns wrong second derivatives through ``layer_norm`` in torch 2.13 (pytorch/pytorch#196700).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.func import grad, jvp, vmap

from benchmarks.common import (
    apply_threads,
    base_parser,
    batch_for,
    build_workload,
    emit,
    interleaved,
    machine,
    mean_gradient,
    rounded,
    synchronize,
)
from objreg.analysis.math.curvature import Curvature
from objreg.analysis.math.functional import Params, flat_dot
from objreg.analysis.parallel.devices import resolve_device


def s_from_products(directions: list[Params], products: list[Params]) -> torch.Tensor:
    return torch.stack([torch.stack([flat_dot(g, h) for h in products]) for g in directions])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name (default: 'default' with --quick, else 'bert-base')")
    parser.add_argument("--batch-size", type=int, default=32, help="pre-training batch size of each objective")
    parser.add_argument("--downstream-size", type=int, default=32, help="examples defining D (one chunk)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(args.threads)
    device = resolve_device(args.device)
    model = args.model or ("default" if args.quick else "bert-base")
    workload = build_workload(
        "mlm", model, args.batch_size, args.seq_len, device, downstream_size=args.downstream_size, objectives=["sop"]
    )
    sop = batch_for(workload, "sop", args.batch_size, args.seq_len)
    shared, downstream = workload.shared, workload.downstream
    directions = [mean_gradient([workload.function], shared), mean_gradient([sop], shared)]
    total = sum(f.batch_size for f in downstream)

    def loss(params: Params) -> torch.Tensor:
        return sum(f(params).sum() for f in downstream) / total  # type: ignore[return-value]

    def gradient() -> Params:
        return mean_gradient(downstream, shared)

    def hvp() -> Params:
        return Curvature(downstream, shared, "forward_over_reverse").matvec(directions[0])

    def s_matrix(method: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            _, products = Curvature(downstream, shared, method).gradient_and_products(directions)
            return s_from_products(directions, products)

        return run

    paths = {
        "gradient": gradient,
        "hvp": hvp,
        "s_matrix": s_matrix("auto"),
        "s_matrix_forward_over_reverse": s_matrix("forward_over_reverse"),
        "s_matrix_double_backward": s_matrix("double_backward"),
    }
    repeats = args.repeats or (7 if args.quick else 3)
    times = interleaved(paths, repeats, device)
    auto = Curvature(downstream, shared, "auto")
    auto.gradient_and_products(directions[:1])
    s_eager = paths["s_matrix"]()
    s_forward = paths["s_matrix_forward_over_reverse"]()
    s_double = paths["s_matrix_double_backward"]()
    result: dict[str, Any] = {
        "benchmark": "curvature",
        "machine": machine(device),
        "config": {
            "model": model,
            "objectives": ["mlm", "sop"],
            "downstream": "qa",
            "batch_size": args.batch_size,
            "downstream_size": args.downstream_size,
            "seq_len": args.seq_len,
            "repeats": repeats,
            "shared_parameters": workload.parameters,
        },
        "gradient_s": rounded(times["gradient"]),
        "hvp_s": rounded(times["hvp"]),
        "hvp_ratio": rounded(times["hvp"] / times["gradient"]),
        "s_matrix_s": rounded(times["s_matrix"]),
        "s_matrix_ratio": rounded(times["s_matrix"] / times["gradient"]),
        "s_matrix_auto_method": auto.method,
        "s_matrix_forward_over_reverse_ratio": rounded(times["s_matrix_forward_over_reverse"] / times["gradient"]),
        "s_matrix_double_backward_ratio": rounded(times["s_matrix_double_backward"] / times["gradient"]),
        "s_matrix": [[rounded(float(x), 6) for x in row] for row in s_eager],
        "s_methods_max_relative_difference": rounded(float((s_forward - s_double).abs().max() / s_eager.abs().max())),
    }
    if not args.no_compile:
        result.update(compiled(loss, shared, directions, times["gradient"], s_eager, repeats, device))
    rows = [(k, v) for k, v in result.items() if not isinstance(v, (dict, list))]
    emit(result, args.json, rows)
    return result


def compiled(
    loss: Callable[[Params], torch.Tensor],
    shared: Params,
    directions: list[Params],
    eager_gradient_s: float,
    s_eager: torch.Tensor,
    repeats: int,
    device: torch.device,
) -> dict[str, Any]:
    """The gradient and the S matrix (the analyzer's vmapped forward-over-reverse) under torch.compile."""
    stacked = {n: torch.stack([d[n] for d in directions]) for n in shared}

    def gradient(params: Params) -> Params:
        return grad(loss)(params)

    def products(params: Params, tangents: Params) -> Params:
        return vmap(lambda v: jvp(grad(loss), (params,), (v,))[1])(tangents)

    try:
        compiled_gradient = torch.compile(gradient)
        compiled_products = torch.compile(products)
        start = time.perf_counter()
        compiled_gradient(shared)
        synchronize(device)
        compile_gradient_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled_products(shared, stacked)
        synchronize(device)
        compile_s_s = time.perf_counter() - start
    except Exception as error:  # report any failure to compile, whatever its type
        return {"compile": f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"}

    def s_matrix() -> torch.Tensor:
        batched = compiled_products(shared, stacked)
        return s_from_products(directions, [{n: t[i] for n, t in batched.items()} for i in range(len(directions))])

    times = interleaved({"gradient": lambda: compiled_gradient(shared), "s_matrix": s_matrix}, repeats, device)
    s_compiled = s_matrix()
    return {
        "compile": "ok",
        "compile_time_s": {"gradient": rounded(compile_gradient_s), "s_matrix": rounded(compile_s_s)},
        "compiled_gradient_s": rounded(times["gradient"]),
        "compiled_s_matrix_s": rounded(times["s_matrix"]),
        "compiled_s_matrix_ratio": rounded(times["s_matrix"] / times["gradient"]),
        "compiled_s_matrix_vs_eager_gradient": rounded(times["s_matrix"] / eager_gradient_s),
        "compiled_vs_eager_s_max_relative_difference": rounded(
            float((s_compiled - s_eager).abs().max() / s_eager.abs().max())
        ),
    }


if __name__ == "__main__":
    main()
