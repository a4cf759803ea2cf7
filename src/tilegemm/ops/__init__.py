"""Public op stubs (api.py), shared input checks (checks/, one module per op family) and the backends."""
