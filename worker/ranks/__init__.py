"""Programs one rank runs, per job kind, launched torchrun-style."""
