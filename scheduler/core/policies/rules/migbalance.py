"""The balance and MIG: fgd-cpu's balance counts no MIG GPU, and leaves MIG nodes out.

The balance counts partly used GPUs by the share sizes their holes admit. A MIG GPU's hole
admits what its free slots allow, not what its size suggests (three free slices of an H100 take
a 3g.40gb only as slices 4-6), so MIG GPUs are left out of the counts and placements on MIG
nodes out of the balance; a placement left out rises as much as the counted placement that
rises most (:meth:`..fgdcpu.FgdCpu.adjust`), so the balance, blind to it, never prefers it.
"""

from __future__ import annotations

import numpy as np

from . import on_groups


def view(group_gaps: np.ndarray, mig: np.ndarray, node_group: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The gap histogram of the GPUs the balance counts (``group_gaps[g, level]`` summed over
    the groups that are not MIG, ``mig`` a mask per group) and per scored node whether it is
    left out (on a MIG group); None when no group is MIG (every GPU and node counts)."""
    if not mig.any():
        return None
    gaps: np.ndarray = group_gaps[~mig].sum(axis=0)
    return gaps, on_groups(node_group, mig)
