"""The simulator: trace readers, cluster builders, the event loop, metrics, plots.

It calls the packing core (``scheduler.core``) for every fit, allocation and score,
through :class:`scheduler.core.select.Scoreboard`; it never reaches the cluster.

Modules, lower first: ``errors`` -> ``model`` -> readers (``openb``, ``scenario``,
``kubelist``, ``load``) -> ``protocol`` (arrival order) -> ``engine`` (one run) ->
``metrics`` -> ``runner`` (many runs, processes, progress) -> ``report``, ``bound``
-> ``commands`` (the CLI).
"""
