"""The node agent (``gpuslice agent``, one pod per GPU node): makes each allocation record true on its node.

It publishes the node's ``gpuslice.io/inventory`` from the hardware (health included),
creates and destroys dynamic MIG instances at the recorded placements, runs or finds the
MPS control daemons, and hands each container exactly its share through the kubelet's
device plugin API. GPU access goes through one seam (:mod:`.gpus`: NVML or a fake), the
cluster through another (:mod:`.cluster`, built by the composition root). See
docs/node-agent.md.
"""
