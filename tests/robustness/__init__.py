"""Robustness suites: tables of bad inputs, each row asserting the exit status or error code, a
clear message naming the place and the fix, no traceback, and nothing left behind.

`test_compiler_inputs.py` drives the compiler's command line (`python -m flowc`, a real
subprocess) with broken .flow files of many kinds, bad flags, missing files, directories,
devices, binary and huge inputs, BOMs, deep nesting and bad or unwritable output targets.
"""
