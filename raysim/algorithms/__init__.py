"""Federated methods: one file each, a ``Strategy`` and optionally a ``ClientAlgorithm``.

This package never imports Ray or MLflow.
"""

from .base import ClientAlgorithm, Method, MethodParams, Strategy, Update
from .registry import get_method, method_names, register

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
