"""Public op stubs (api.py), shared input checks (checks.py) and the backends."""
