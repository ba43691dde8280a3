"""Distributed builds: a plan as a task graph, run on Ray (optional dependency)."""
