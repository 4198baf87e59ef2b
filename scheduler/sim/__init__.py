"""The simulator: trace readers, cluster builders, the event loop, metrics, plots.

It calls the packing core (``scheduler.core``) for every fit, allocation and score,
through :class:`scheduler.core.board.Board`; it never reaches the cluster.

Modules, lower first: ``errors`` -> ``model`` -> readers (``openb``, ``scenario``,
``kubelist``, ``load``) -> ``protocol`` (arrival order) -> ``engine`` (one run) ->
``metrics`` -> ``runner`` (many runs, processes, progress) -> ``report``, ``plots``, ``bound``
-> ``commands`` (the CLI). Sweeps: ``sweep`` (the description, run ids) -> ``executors``
(local processes, Dask) -> ``store`` (one file per run) -> ``sweeper`` (resume, run, report).
"""
