"""The packing core: pure, typed, no I/O. The extender and the simulator both call it.

Layering inside the core (lower never imports higher):
errors, quantity -> catalog -> inventory -> request -> allocation -> mig -> capacity
-> state -> fit -> (preempt, fragmentation) -> policies -> select -> the board's parts (texts,
devstates, histograms -> columns -> nodescores, reasons -> scorecache) -> board -> defrag.

Import from the modules (``from scheduler.core.fit import fit``): the package itself imports
nothing, so that a command that needs only ``errors`` (``gpuslice --help``, ``gpuslice
inspect``) does not load numpy and networkx.
"""
