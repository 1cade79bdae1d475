"""detlab: where two training runs that should be bit-identical part, and what reproducibility costs."""
