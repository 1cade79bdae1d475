"""Callbacks that record a framework's training loop with `detlab.Recorder` (docs/sdk.md).

`detlab.integrations.lightning.DetlabCallback` for Lightning, `detlab.integrations.transformers.DetlabCallback`
for the Hugging Face Trainer. Each module imports its framework when it is imported itself: `import detlab`
and this package import neither.
"""
