"""Models and loading (torch): the registry of architectures (`registry.py`), the contract the
executor uses (`base.py`), the shared decoder (`decoder.py`) and one file per architecture
(`models/`), attention backends, linear methods, GGUF and Hugging Face loaders, tokenizer and
chat templates, and the sampler."""
