"""gpuslice: a Kubernetes scheduler extender that shares NVIDIA GPUs densely and safely."""

__version__ = "0.1.0"
