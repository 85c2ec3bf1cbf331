"""Runtime: binds kernels once, generates a straight-line run function, validates feeds."""
