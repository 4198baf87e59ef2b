"""Records checked before they are honoured: against the node's real GPUs and against each other.

Any namespace may write any pod, annotations included, and the webhook is not always in the
path; so the agent honours a record only if the core's capacity model accepts it on the node
the hardware describes now (the inventory the agent publishes, without measured stray use),
beside the records it honours already. That one rule covers a GPU UUID or index the node
lacks, a share larger than its GPU (an MPS share of 200%, or of more memory than the GPU
has), an illegal MIG placement, and the same exclusive GPU, MIG slots or MPS capacity given
twice. Records are applied in the order the agent trusts them: those already handed over
first, then by the order the pods were seen bound; the first claim wins, a later one that
collides is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from scheduler.core.allocation import Allocation
from scheduler.core.errors import RecordError
from scheduler.core.inventory import Node
from scheduler.core.state import NodeState

# The agent checks GPUs only: CPU, memory and the pod count are the kubelet's to enforce.
_UNBOUNDED = 1 << 62


def gpu_only(node: Node) -> Node:
    """``node`` with CPU, memory and pod count left unbounded."""
    return replace(node, cpu_milli=_UNBOUNDED, memory_mib=_UNBOUNDED, max_pods=_UNBOUNDED)


def record_problem(node: Node, honoured: Iterable[tuple[str, Allocation]], pod: str, record: Allocation) -> str:
    """Why ``pod``'s record cannot be honoured beside ``honoured`` (in trust order) on ``node``;
    "" if it can. A record among ``honoured`` that itself does not fit is left out: it is
    refused on its own turn and claims nothing meanwhile."""
    state = NodeState.empty(gpu_only(node))
    for other, alloc in honoured:
        if other == pod:
            continue
        try:
            state = state.apply(other, alloc)
        except RecordError:
            continue
    try:
        state.apply(pod, record)
    except RecordError as exc:
        return str(exc)
    return ""
