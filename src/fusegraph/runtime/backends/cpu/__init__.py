"""The CPU backend (``backend.py``): oneDNN kernels, script segments, prepacked weights,
threading and host-memory policy."""
