"""The remote worker agent and its scanner plugins."""
