"""GPU nodes' CPU: a pod that asks no GPU loses ``price`` points on every GPU node while a node
without GPUs can take it.

A core such a pod takes on a GPU node is a core the GPU pods of that node cannot have, and a
node without GPUs loses nothing by taking it: it runs on a GPU node only when the nodes without
GPUs are full, or score far better.
"""

from __future__ import annotations

import numpy as np

from ..reserve import squash


def apply(scores: np.ndarray, on_gpu: np.ndarray, price: float) -> np.ndarray:
    """``scores`` of a pod without GPUs (``-inf`` where it does not fit), ``price`` points lower
    on the nodes ``on_gpu`` when some other node fits it (kept in 0..100 by ``squash``)."""
    fits = scores > -np.inf
    if not price or not (~on_gpu & fits).any():
        return scores
    priced: np.ndarray = np.where(on_gpu & fits, squash(scores - price), scores)
    return priced
