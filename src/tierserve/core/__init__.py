"""The torch-free core: scheduler, KV cache manager, scheduler outputs."""
