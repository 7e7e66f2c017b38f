"""The registered checks; importing this package registers them all, in a fixed order."""

from flowc.check.checks import declarations, fields, graph_analysis, graphs, interfaces, resources, types

__all__ = ["declarations", "fields", "graph_analysis", "graphs", "interfaces", "resources", "types"]
