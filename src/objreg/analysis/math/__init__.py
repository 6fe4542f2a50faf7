"""The mathematics of the analysis: losses as pure functions of the shared parameters
(:mod:`.functional`); per-sample dots (:mod:`.per_sample`), by ghost rules (:mod:`.ghost`,
:mod:`.ghost_rules`), riding the loop's backward (:mod:`.riding`, :mod:`.riding_calls`,
:mod:`.autograd_graph`, :mod:`.rng_replay`) or per-example linear layers
(:mod:`.per_example_linear`); Hessian-vector products (:mod:`.curvature`); the downstream loss
``D`` (:mod:`.downstream`) and the re-fitted head's ``D*`` (:mod:`.refit`, its fit
:mod:`.head_fit`, its derivatives :mod:`.refit_curvature`); gradients over processes
(:mod:`.gradients`); the split of an optimizer step (:mod:`.optimizers`, :mod:`.shapley`) and its
memory (:mod:`.costs`); the Taylor terms (:mod:`.taylor`) and ``D``'s resolution
(:mod:`.resolution`); Adam's exact one-step counterfactual (:mod:`.counterfactual`); the change
as a quadratic in the weights (:mod:`.weight_model`), its trust-region optimum
(:mod:`.trust_region`) and the run's counterfactual (:mod:`.mixture`); the spectrum
(:mod:`.spectrum`); intervals (:mod:`.stats`, :mod:`.batch_means`); how well one ranking predicts another
(:mod:`.ranking`); checks shared by the kept
states (:mod:`.state_checks`). Imports :mod:`objreg.analysis.parallel` and nothing above it."""
