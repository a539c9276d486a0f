"""`tierserve bench serve`: a priority-aware load generator for any OpenAI-compatible server."""
