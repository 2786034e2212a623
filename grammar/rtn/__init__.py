"""Recursive transition networks: modules (byte DFAs that call modules), their algebra, layout and guide."""

from .build import regex_to_module
from .guide import StackGuide
from .module import Module
from .program import Program

__all__ = ["Module", "Program", "StackGuide", "regex_to_module"]
