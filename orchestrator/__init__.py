"""dpx orchestrator: recipe → trials → state store → backend → driver, and the `dpx` CLI.

Kept import-free on purpose: the in-trial entry point (`dpx.orchestrator.runner`) lives in this package and must
run on a bare GPU node without pydantic, omegaconf, mlflow, duckdb or ray.
"""
