"""Backend selection and the op registry."""
