"""One file per architecture, each registered by name in `tierserve/model/registry.py`."""
