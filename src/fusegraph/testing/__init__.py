"""Test and benchmark material that ships with the package: the ONNX conformance harness
(``conformance.py``) and the light-model zoo with random weights (``zoo.py``). The library
never imports this package."""
