"""Test harnesses shipped with the package: the ONNX backend node suite runner (``conformance``)
and the architecture zoo of checked ONNX exports (``architectures``)."""
