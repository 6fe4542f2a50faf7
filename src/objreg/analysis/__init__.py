"""The gradient-alignment analysis: ``analyze`` (:mod:`~objreg.analysis.run`), the training loop
and its probes, the mathematics they use (functional losses, per-sample dots, Hessian-vector
products, the step's split, Taylor terms, statistics), and the report. Imports ``objreg.core``
and ``objreg.toolkit``; objectives, tasks, models and corpora are reached through the registry.
docs/analysis.md maps the modules.
"""
