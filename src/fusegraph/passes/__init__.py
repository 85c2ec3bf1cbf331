"""Graph optimisation passes (see passes/manager.py and passes/pipeline.py)."""
