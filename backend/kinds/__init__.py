"""Job kinds as plug-ins: one module per kind (its request model, plan, report, list verdict and resubmission),
found through one registry (detlab.backend.kinds.registry.KINDS) that jobs, settle, the API and /meta read."""
