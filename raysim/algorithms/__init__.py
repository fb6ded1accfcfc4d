"""Federated methods: one file each, a ``Strategy`` and optionally a ``ClientAlgorithm``.

This package never imports Ray or MLflow.
"""

from raysim.algorithms.base import ClientAlgorithm, Method, MethodParams, Strategy, Update
from raysim.algorithms.registry import get_method, method_names, register

__all__ = [
    "ClientAlgorithm",
    "Method",
    "MethodParams",
    "Strategy",
    "Update",
    "get_method",
    "method_names",
    "register",
]
