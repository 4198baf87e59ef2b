"""The kube-scheduler extender: the wire protocol over HTTP, a cluster cache, and the binder.

Layers, higher importing lower only:
``wire`` (JSON envelope) and ``config`` -> ``cache`` (cluster view fed by a Backend)
-> ``service`` (filter, prioritize, bind, preempt on the core) -> ``app`` (the HTTP routes)
-> ``server`` (uvicorn) -> ``run`` (``gpuslice serve``: the port first, the sync behind it, the demo).
``client``, ``columns`` and ``inspection`` (``gpuslice inspect``) load neither the web stack nor numpy.
It never imports ``kubernetes``: the composition root hands it a backend.
"""
