"""Run: the run directory's contract (manifest, records), the runner, the worker processes, merge."""
