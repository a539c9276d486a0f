"""The HTTP face: an OpenAI-compatible API with tiers, tenants, admission control and metrics."""
