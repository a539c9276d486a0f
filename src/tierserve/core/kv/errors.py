class KVCacheError(RuntimeError):
    """Misuse of the KV cache manager (unknown request, double free, ...)."""
