"""Robustness suites: tables of bad inputs, each row asserting the exit status or error code, a
clear message naming the place and the fix, no traceback, and nothing left behind.

`test_compiler_inputs.py` drives the compiler's command line (`python -m flowc`, a real
subprocess) with broken .flow files of many kinds, bad flags, missing files, directories,
devices, binary and huge inputs, BOMs, deep nesting and bad or unwritable output targets.
`test_http_inputs.py` sends bad requests to a real server process over loopback (bad JSON,
wrong types, huge and deeply nested bodies, bad query values, unknown paths and methods, wrong
content types, disconnects) and checks that statistics() returns to zero after each.
`test_bundle_inputs.py` runs `flowc run --once` (a real subprocess) on broken bundles, role
implementations that cannot run, and bad `--input`, `--timeout` and serving options.
"""
