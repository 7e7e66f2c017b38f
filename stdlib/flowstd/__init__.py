"""flowstd: the standard library of .flow modules (under `lib/`) and ready role implementations.

`import text` in a .flow file finds `lib/text.flow` here when no `text.flow` sits beside the file.
"""
