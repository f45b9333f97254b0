"""Commands beside ``harness run``: explore, capture, preflight, and the catalog across a real
Slurm allocation."""
