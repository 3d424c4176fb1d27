"""Privacy audits of a released run: membership inference (DIBA), baselines, canaries.

Pure parts (no model):

* :mod:`~dpgrpo.audit.features`: DIBA's six prompt-level features from rewards, per-token
  log-probabilities and texts (Liu et al., "GRPO Privacy Is at Risk", Section 5);
* :mod:`~dpgrpo.audit.baselines`: LOSS, zlib, Min-K% and entropy, raw and base-calibrated;
* :mod:`~dpgrpo.audit.mia`: the stacking classifier, stratified k-fold evaluation, Table 3's
  hardness split;
* :mod:`~dpgrpo.audit.metrics`: AUC, balanced accuracy, TPR at fixed FPR;
* :mod:`~dpgrpo.audit.sequential`: Besag and Clifford's sequential Monte Carlo p-value, the
  permutation test's stopping rule;
* :mod:`~dpgrpo.audit.one_run`: the one-run epsilon lower bound of Steinke, Nasr and Jagielski
  (2023);
* :mod:`~dpgrpo.audit.fdp`: the f-DP one-run bound against the certified mechanism's
  trade-off family (Xiang et al. 2025's order-statistics tail);
* :mod:`~dpgrpo.audit.independence`: the check that the rounds' noises are independent;
* :mod:`~dpgrpo.audit.canary`: canaries, secret inclusion bits, the saved plan, canary signal;
* :mod:`~dpgrpo.audit.gradient_canaries`, :mod:`~dpgrpo.audit.whitebox`,
  :mod:`~dpgrpo.audit.whitebox_stats` and :mod:`~dpgrpo.audit.mechanism_audit`: the white-box
  audit of the mechanism itself (``dpgrpo audit mechanism``; :func:`~dpgrpo.audit.
  mechanism_audit.audit_mechanism`): gradient canaries through the real sampler, mechanism and
  noise, which can fail a broken mechanism (docs/auditing.md).

Model-facing parts: :mod:`~dpgrpo.audit.scoring` (sampling and scoring with the release and
its base), :mod:`~dpgrpo.audit.pipeline` (audits of a run directory) and
:mod:`~dpgrpo.audit.report` (JSON, markdown, ROC figure). Submodules are imported on demand so
that ``import dpgrpo.audit`` stays light (scikit-learn and matplotlib are the ``audit`` extra).
"""
