"""The campaign: the spec and what it expands into (runs, policy, failure classes)."""
