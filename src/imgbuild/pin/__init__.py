"""Pinning: the resolver (the target's rules, then each block's pin rule), lock files, and the package-index
lookups the resolver may need (a torch wheel's METADATA by range requests)."""
