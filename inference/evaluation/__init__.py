"""What a posterior's predictions are worth: predictive metrics, the trivial-predictor check, ArviZ
export and diagnostics, per-member metrics of ensembles and chains.

* :mod:`.metrics` — RMSE, test log-likelihood, coverage, calibration (regression and classification);
* :mod:`.circular` — the wrapped predictive density of outputs that are angles (scoring on the circle);
* :mod:`.sanity` — the comparison with the trivial predictor that flags a failed fit;
* :mod:`.arviz_export` — ``InferenceData`` with posterior, log-likelihood, predictive and sample stats;
* :mod:`.diagnostics` — R-hat, ESS and the warnings that go with them;
* :mod:`.member_metrics` — each ensemble member's or chain's metrics and their disagreement;
* :mod:`.fidelity` — distances to a reference posterior's predictive (agreement, total variation, W2,
  reference coverage).
"""
