"""Fault-injection tests: the harness (a TCP fault proxy, an operation history and its checkers,
a session report) and, on top of it, scenarios against the real servers.

This package owns everything under tests/faults/; nothing outside it imports from here.
"""
