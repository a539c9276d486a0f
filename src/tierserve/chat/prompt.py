"""Chat messages to prompt token ids: the model's template (or the `--chat-template` override),
rendered with the tokenizer's special tokens, then encoded without adding any (the template
places BOS where the model wants it), as transformers' `apply_chat_template` does."""

from __future__ import annotations

from typing import Any

from tierserve.chat.template import ChatTemplate, ChatTemplateError
from tierserve.model.tokenizer import ChatTokenizer

# Variables the renderer sets itself; `chat_template_kwargs` may not replace them.
RESERVED_VARIABLES = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"}
)


class ChatPrompter:
    def __init__(self, tokenizer: ChatTokenizer, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        source = template if template is not None else tokenizer.chat_template
        self.template = ChatTemplate(source) if source else None
        self.special_tokens = {
            name: tok
            for name, tok in (
                ("bos_token", tokenizer.bos_token),
                ("eos_token", tokenizer.eos_token),
            )
            if tok is not None
        }

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text; raises ChatTemplateError (a 400 for the API)."""
        if self.template is None:
            raise ChatTemplateError(
                "this model has no chat template: use the completions API, or start the "
                "server with --chat-template FILE"
            )
        clash = sorted(RESERVED_VARIABLES & set(kwargs or ()))
        if clash:
            raise ChatTemplateError(
                f"chat_template_kwargs may not set {', '.join(clash)} (given by the request's "
                "own fields)"
            )
        return self.template.render(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables={**self.special_tokens, **(kwargs or {})},
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
