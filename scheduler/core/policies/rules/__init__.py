"""fgd-reserve's rules (:mod:`..fgdreserve`), each a small pure module: what it adds to
fgd-cpu's score, or how it sets one of fgd-cpu's weights, from what it is given.

* :mod:`..reserve`: the reservation price of the GPU groups pinned pods need;
* :mod:`.cpubound`: the stranding weight, stood down when CPU, not GPU, will run out;
* :mod:`.departures`: the balance weight, stood down as pods leave;
* :mod:`.migbalance`: the balance's view of the cluster, without MIG GPUs;
* :mod:`.gpucpu`: GPU nodes' CPU kept for GPU pods while nodes without GPUs can take a pod.
"""

from __future__ import annotations

import numpy as np


def on_groups(node_group: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Per scored node (``node_group``: its group, -1 for none): is it in one of the groups
    ``chosen`` (a mask per group)."""
    on: np.ndarray = (node_group >= 0) & chosen[np.maximum(node_group, 0)]
    return on
