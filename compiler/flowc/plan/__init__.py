"""The static plan the runtime executes by table lookups: `build_plan(program)`."""

from flowc.plan.build import build_plan, plan_graph
from flowc.plan.model import GraphPlan, GroupPlan, JoinField, NodePlan, RolePlan, Slot, StaticPlan, Target

__all__ = [
    "GraphPlan",
    "GroupPlan",
    "JoinField",
    "NodePlan",
    "RolePlan",
    "Slot",
    "StaticPlan",
    "Target",
    "build_plan",
    "plan_graph",
]
