"""Chat prompts and replies: chat templates rendered as transformers renders them
(`template.py`) and tool calls parsed from the model's text (`tool_parser.py`). No torch, no
FastAPI."""
