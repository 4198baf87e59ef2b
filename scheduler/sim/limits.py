"""Limits of the simulator's options, importable before anything heavy (the command line
shows them in its help)."""

# The largest workload inflation: 10 x the GPU capacity is already far past where every
# policy has filled the cluster; more only makes a run longer (and ``inf`` never ends).
MAX_INFLATE = 10.0
