"""Users and bearer tokens: hashed at rest, shown once, looked up with a short cache."""
