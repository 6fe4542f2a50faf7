"""The mathematics of the analysis: losses as pure functions of the shared parameters
(:mod:`.functional`), per-sample dots (:mod:`.per_sample`, :mod:`.ghost`), Hessian-vector
products (:mod:`.curvature`), the downstream loss ``D`` (:mod:`.downstream`), gradients over
processes (:mod:`.gradients`), the split of an optimizer step (:mod:`.optimizers`,
:mod:`.shapley`), the Taylor terms (:mod:`.taylor`) and ``D``'s resolution (:mod:`.resolution`),
Adam's exact one-step counterfactual (:mod:`.counterfactual`), the mixture's model
(:mod:`.mixture`), the spectrum (:mod:`.spectrum`) and intervals (:mod:`.stats`).
Imports :mod:`objreg.analysis.parallel` and nothing above it."""
