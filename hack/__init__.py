"""Developer tools: the local control plane (``hack.testenv``), the closed-loop driver, the demo, benchmarks.

A package, so tests and scripts import these by name (``from hack.testenv import cluster``) instead of putting
folders on ``sys.path``; run the scripts from the repository root as modules: ``python -m hack.demo``.
"""
