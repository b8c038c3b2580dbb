"""The Python API: ``Checkpoint`` (a facade over a catalog) and slicing; torch only when asked for."""
