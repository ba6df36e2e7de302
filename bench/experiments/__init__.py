"""The paper's active-learning experiments, one command each (see docs/results/README.md).

* :mod:`bench.experiments.common`: the loop, the resumable results store, learning-curve plots;
* :mod:`bench.experiments.penalty_matrix`: the pairwise penalty matrix;
* scripts: ``linear_mnist``, ``mlp_classification``, ``regression``, ``penalty``, ``conventions``
  (``python -m bench.experiments.<name> [--smoke] [--out DIR] [--seeds N]``).
"""
