"""Test harnesses shipped with the package (the ONNX backend node suite runner)."""
