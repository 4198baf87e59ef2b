"""The preempt verb's decision, node by node: which pods to evict so that the pod fits there.

kube-scheduler proposes victims per node by its own filters (CPU, memory, pod room, affinity,
ports, and the GPU units of :mod:`scheduler.core.units`) and by priority; it cannot see which
GPU a share is on. Its answer may name any pod on that node (it maps each UID back to a pod on
the node, not to its proposal), so per candidate node gpuslice answers:

* a proposed victim that holds no share gpuslice counts on the node (a pod without a GPU
  request, or one another scheduler placed), and one whose UID gpuslice does not know (a pod
  created since its last watch event), is kept: kube-scheduler chose it for a reason gpuslice
  cannot judge, and releasing it frees no share gpuslice sees;
* among the pods that hold shares on the node, the proposed victims and every other pod of
  strictly lower priority than the preemptor (kube-scheduler's own eligibility rule) that is
  not already being deleted, the fewest whose release lets the pod fit
  (:func:`scheduler.core.preempt.choose_victims`: one concrete share, then the least important,
  then the least GPU), with the node's CPU, memory and pod room counted over every live pod on
  it, the pods gpuslice does not place included (from their requests): a victim kube-scheduler
  needed for CPU or memory is never given back. If a pod on the node has requests gpuslice
  cannot read, its CPU and memory are unknown: the node keeps the whole proposal when evicting
  it frees a share, else it is dropped;
* a node gpuslice does not know, or where no set of those pods frees a share, is dropped;
* a node where the pod fits with no victim at all (kube-scheduler proposed them for its own
  reasons) keeps the proposal as it is: kube-scheduler refuses an answer without victims;
* NumPDBViolations: kube-scheduler counts the violations of its proposal, not which victims
  cause them; the answer keeps its count, at most the number of victims answered (as if every
  violating victim were among those kept: never fewer than there may be). gpuslice does not
  read PodDisruptionBudgets: a victim beyond the proposal is not counted.

GPU quotas. For a pod whose namespace has a GPUQuota, what it would hold counts against what
the namespace holds (:mod:`scheduler.core.quota`); evicting another namespace's pod frees none
of it. Where the quota holds the pod back, only victims of its own namespace are considered,
and a node is kept only where evicting them makes room on the node and within the quota
(the fewest that make room, then more of the namespace's own proposed victims, least important
first, until the quota admits the pod); a node where no such set exists is dropped.

The work per call is bounded: ``budget`` fit questions shared by the nodes (each gets at least
:data:`MIN_PER_NODE`); past a node's share its answer is still minimal under inclusion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.allocation import Allocation
from scheduler.core.errors import RecordError, RequestError
from scheduler.core.fit import fit
from scheduler.core.pods import has_ended, priority_of
from scheduler.core.preempt import Candidate, Preemption, choose_victims
from scheduler.core.quota import NOTHING, Charge, Quota, charge, least_charge, namespace_of, refusal
from scheduler.core.request import Demand, parse_pod
from scheduler.core.state import NodeState

from .cache import ClusterCache
from .wire import NodeVictims

BUDGET = 20_000  # fit questions per preempt call: about 0.1 to 1 s of work
MIN_PER_NODE = 64


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer: the victims' UIDs kept (empty: the node is dropped), the violations
    answered, and why, in words (for the log)."""

    uids: tuple[str, ...]
    pdb_violations: int
    why: str


@dataclass(frozen=True, slots=True)
class QuotaView:
    """The pod's namespace, its quotas, and what the namespace holds without the pod."""

    namespace: str
    quotas: tuple[Quota, ...]
    used: Charge


@dataclass(frozen=True, slots=True)
class _Node:
    """What the decision needs of one node, copied from the cache under its lock."""

    state: NodeState | None
    problem: str
    keys: Mapping[str, str]  # victim UID -> pod key, for the UIDs the cache knows
    priorities: Mapping[str, int]  # pod key -> spec.priority
    others: Sequence[tuple[str, Mapping[str, Any]]]  # live pods on the node the state does not hold
    eligible: Mapping[str, tuple[str, int]]  # pod key -> (UID, priority): share holders below the preemptor


def _gather(cache: ClusterCache, proposal: Mapping[str, NodeVictims], priority: int | None) -> dict[str, _Node]:
    """Everything the decision reads of the cache, in one pass over its pods (under its lock).
    ``priority``: the preemptor's; the pods holding shares below it are eligible (None: none)."""
    wanted = set(proposal)
    with cache.lock:
        others: dict[str, list[tuple[str, Mapping[str, Any]]]] = {name: [] for name in wanted}
        eligible: dict[str, dict[str, tuple[str, int]]] = {name: {} for name in wanted}
        states = {name: cache.state(name) for name in wanted}
        held = {name: {k for k, _ in state.pods} for name, state in states.items() if state is not None}
        for key, view in cache.pods.items():
            on_node = held.get(view.node)
            if on_node is None or has_ended(view.obj):
                continue
            if key not in on_node:
                others[view.node].append((key, view.obj))
            elif priority is not None and view.uid and not _deleting(view.obj):
                below = priority_of(view.obj)
                if below < priority:
                    eligible[view.node][key] = (view.uid, below)
        out: dict[str, _Node] = {}
        for name, victims in proposal.items():
            keys: dict[str, str] = {}
            priorities: dict[str, int] = {}
            for uid in victims.uids:
                found = cache.key_of_uid(uid)
                if found is not None:
                    keys[uid] = found
                    pod = cache.pods.get(found)
                    priorities[found] = priority_of(pod.obj) if pod is not None else 0
            out[name] = _Node(states[name], cache.problem(name), keys, priorities, others[name], eligible[name])
    return out


def _deleting(obj: Mapping[str, Any]) -> bool:
    """Whether the pod is already being deleted (evicting it again frees nothing sooner)."""
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def _host_complete(state: NodeState, others: Sequence[tuple[str, Mapping[str, Any]]], prefix: str) -> NodeState | None:
    """``state`` with the CPU, memory and pod slot of every other live pod on the node (share-less
    allocations from their requests); None if one's requests cannot be read or do not fit."""
    for key, obj in others:
        try:
            demand = parse_pod(obj, prefix).demand
            state = state.apply(key, Allocation(state.node.name, (), demand.cpu_milli, demand.memory_mib))
        except (RequestError, RecordError):
            return None
    return state


def decide(
    demand: Demand,
    proposal: Mapping[str, NodeVictims],
    cache: ClusterCache,
    prefix: str,
    budget: int = BUDGET,
    quota: QuotaView | None = None,
    priority: int | None = None,
) -> dict[str, Verdict]:
    """Per proposed node, the victims to answer (see the module). ``priority``: the preemptor's
    ``spec.priority``; None chooses among the proposed victims only."""
    gathered = _gather(cache, proposal, priority)
    limit = max(MIN_PER_NODE, budget // max(1, len(proposal)))
    return {
        name: _decide_node(demand, victims, gathered[name], prefix, limit, quota) for name, victims in proposal.items()
    }


def _decide_node(
    demand: Demand, victims: NodeVictims, node: _Node, prefix: str, limit: int, quota: QuotaView | None = None
) -> Verdict:
    state = node.state
    if state is None:
        return Verdict((), 0, f"dropped: {node.problem or 'node unknown to gpuslice'}")
    blocked = None
    if quota is not None:
        blocked = refusal(quota.quotas, quota.used, least_charge(demand.gpu, state.node) or NOTHING)
    kept: list[str] = []  # UIDs kept whatever gpuslice decides
    candidates: list[Candidate] = []
    by_key: dict[str, str] = {}
    for uid, given in zip(victims.uids, victims.priorities, strict=True):
        key = node.keys.get(uid)
        if key is None or state.allocation_of(key) is None:
            kept.append(uid)
            continue
        if blocked is not None and quota is not None and namespace_of(key) != quota.namespace:
            continue  # held back by its own quota: another namespace's share frees none of it
        candidates.append(Candidate(key, given if given is not None else node.priorities.get(key, 0)))
        by_key[key] = uid
    for key, (uid, below) in node.eligible.items():  # beyond the proposal: any pod below the preemptor
        if (
            key in by_key
            or uid in kept
            or (blocked is not None and quota is not None and namespace_of(key) != quota.namespace)
        ):
            continue
        candidates.append(Candidate(key, below))
        by_key[key] = uid
    if blocked is not None and not candidates:
        return Verdict((), 0, f"dropped: no proposed victim of the pod's namespace to free its quota; {blocked}")
    complete = _host_complete(state, node.others, prefix)
    if complete is None and quota is not None:
        return Verdict(
            (), 0, "dropped: a pod's requests on the node cannot be read, and the pod's namespace has a quota"
        )
    if complete is None:
        for candidate in candidates:
            if by_key[candidate.key] in victims.uids:  # the proposal only: it is answered whole
                state = state.release(candidate.key)
        if not fit(demand, state):
            return Verdict((), 0, "dropped: evicting every proposed victim frees no share")
        return _verdict(victims, victims.uids, "whole proposal: a pod's requests on the node cannot be read")
    for uid in kept:  # what kube-scheduler evicts anyway (pods without a share hold CPU and memory)
        key = node.keys.get(uid)
        if key is not None:
            complete = complete.release(key)
    choice = choose_victims(demand, complete, candidates, limit)
    if isinstance(choice, str):
        return Verdict((), 0, f"dropped: {choice}")
    if quota is not None:
        within = _within_quota(demand, complete, candidates, choice, quota)
        if isinstance(within, str):
            return Verdict((), 0, f"dropped: {within}")
        choice = within
    if not choice.victims and not kept:
        return _verdict(victims, victims.uids, "whole proposal: the pod fits without evicting a pod with a share")
    chosen = [*kept, *(by_key[k] for k in choice.victims)]
    how = "the fewest" if choice.fewest else "minimal (search bounded)"
    beyond = sum(1 for k in choice.victims if by_key[k] not in victims.uids)
    return _verdict(
        victims,
        chosen,
        f"{len(choice.victims)} of {len(candidates)} pods with shares ({how}; {beyond} beyond the proposal)",
    )


def _within_quota(
    demand: Demand, state: NodeState, candidates: Sequence[Candidate], choice: Preemption, quota: QuotaView
) -> Preemption | str:
    """``choice``, or it with more of the namespace's own candidates (least important first),
    such that the pod's allocation once they are gone stays within its namespace's quotas; or
    why none does. Victims of other namespaces free nothing of the quota."""
    node = state.node
    victims = list(choice.victims)
    allocation = choice.allocation
    spare = sorted(
        (c for c in candidates if c.key not in victims and namespace_of(c.key) == quota.namespace),
        key=lambda c: (c.priority, c.key),
    )
    while True:
        freed = sum(
            (charge(a, node) for k in victims if namespace_of(k) == quota.namespace and (a := state.allocation_of(k))),
            NOTHING,
        )
        over = refusal(quota.quotas, quota.used - freed, charge(allocation, node))
        if over is None:
            return Preemption(tuple(victims), allocation, choice.evicted_milli, False, choice.asked)
        if not spare:
            return f"evicting the namespace's own proposed victims frees too little of its quota; {over}"
        victims.append(spare.pop(0).key)
        after = state
        for k in victims:
            after = after.release(k)
        found = fit(demand, after)
        if not found:  # cannot happen: releasing more never takes a share away
            return f"no share once {len(victims)} victims are gone: {found.reason}"
        allocation = found.allocations[0]


def _verdict(victims: NodeVictims, chosen: Sequence[str], why: str) -> Verdict:
    """The chosen UIDs, the proposed ones in the proposal's order, then the others in the chosen order."""
    wanted = set(chosen)
    uids = (*(u for u in victims.uids if u in wanted), *dict.fromkeys(u for u in chosen if u not in victims.uids))
    return Verdict(uids, min(victims.pdb_violations, len(uids)), why)
