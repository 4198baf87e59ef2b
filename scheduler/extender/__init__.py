"""The kube-scheduler extender: the wire protocol over HTTP, a cluster cache, and the binder.

Layers, higher importing lower only:
``wire`` (JSON envelope) and ``config`` -> ``cache`` (cluster view fed by a Backend)
-> ``service`` (filter, prioritize, bind, preempt on the core) -> ``app`` (FastAPI routes)
-> ``commands`` (``gpuslice serve`` / ``gpuslice inspect``).
It never imports ``kubernetes``: the Kubernetes backend is loaded by name at run time.
"""
