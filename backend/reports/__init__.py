"""Results per job kind (train, collective) and the team history (findings)."""
