"""The registered checks; importing this package registers them all, in a fixed order."""

from flowc.check.checks import allows, declarations, fields, graph_analysis, graphs, interfaces, resources, types

__all__ = ["allows", "declarations", "fields", "graph_analysis", "graphs", "interfaces", "resources", "types"]
