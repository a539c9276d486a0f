"""Model definition and loading: Llama-family config, GGUF and Hugging Face loaders, tokenizer
and chat templates, the paged-attention forward pass and the sampler (torch)."""
