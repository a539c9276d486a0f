"""Host settings: CPU threads, memory, paths and the machine fingerprint."""
