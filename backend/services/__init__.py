"""Lifecycle services: jobs, ingest, reconcile, dispatch. Routes own the transaction; these only flush."""
