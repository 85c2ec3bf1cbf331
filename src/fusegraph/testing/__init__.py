"""Test and benchmark material that ships with the package: the ONNX conformance harness
(``conformance.py``), the light-model zoo with random weights (``zoo.py``) and the
architecture zoo of checked ONNX exports from transformers / torch configs
(``architectures.py``). The library never imports this package."""
