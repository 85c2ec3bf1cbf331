"""The CPU backend (``backend.py``): oneDNN primitives called directly (``dnnl/``) writing into
the planned arena with their weights packed once, the ops' portable kernels for the rest,
threading and host-memory policy."""
