"""Automated research: a study file (or a topic) in, swarm runs, statistics and a report out.

See `swarmrl research --help` and the README section "Research studies".
"""
