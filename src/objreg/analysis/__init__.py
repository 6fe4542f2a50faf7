"""The gradient-alignment analysis: functional wrappers, per-sample products (jvp, double
backward, vmap, loop), Hessian-vector products, statistics, the multi-task trainer with probes,
and the report. Imports only ``objreg.core``; objectives, tasks, models and corpora are reached
through the registry.
"""
