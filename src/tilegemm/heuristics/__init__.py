"""Config and backend choice from a problem description (one module per backend family of rules)."""
