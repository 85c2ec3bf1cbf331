"""Imports every op-family module of this package so their ``@register`` calls run.

A family is any module here other than the registry machinery; a new file is picked up
without editing a list.
"""
import importlib
import pkgutil

_MACHINERY = {"registry", "infer", "common", "families", "value_range", "precision_reasons"}

_PACKAGE_PATH = importlib.import_module(__package__).__path__

for _info in sorted(pkgutil.iter_modules(_PACKAGE_PATH), key=lambda i: i.name):
    if _info.name not in _MACHINERY and not _info.name.startswith("_"):
        importlib.import_module(f"{__package__}.{_info.name}")
