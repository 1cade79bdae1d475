"""The torch layer: what touches tensors, below both the SDK and the worker.

Fingerprints (fp1/fp2: torch, Triton and the numpy reference), digests of named tensors, drift sketches, the
probe of a bisect step, collective tracing, checkpoint fingerprints and the stack facts of an `env` record. It
imports the core only: never the server stack, the worker, the SDK or the CLI. Importing this package loads no
torch; its modules do.
"""
