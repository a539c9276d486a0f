"""The new API surface on the embedded model, where real text matters: the chat template and
tokenizer through /tokenize equal transformers' `apply_chat_template`, continue_final_message
continues the assistant's words, and prompt lists / token-id prompts give the same greedy text
as single text prompts."""

import httpx
import openai
import pytest
from transformers import PreTrainedTokenizerFast

from tests.server_utils import running_server, small_engine_args
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
CAPITAL = [
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    {"role": "assistant", "content": "The capital of France is"},
]


@pytest.fixture(scope="module")
def server():
    with running_server(build_engine(small_engine_args())) as (url, state):
        yield url, state, openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_tokenize_matches_transformers_on_the_embedded_template(server):
    url, state, _ = server
    tk = state.tokenizer
    ref = PreTrainedTokenizerFast(
        tokenizer_object=tk.tokenizer, bos_token=tk.bos_token, eos_token=tk.eos_token
    )
    ref.chat_template = tk.chat_template
    want = ref.apply_chat_template(CAPITAL, continue_final_message=True, return_dict=False)
    got = httpx.post(
        f"{url}/tokenize", json={"messages": CAPITAL, "continue_final_message": True}
    ).json()
    assert got["tokens"] == want
    assert tk.decode(want, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\nThe capital of France is"
    )


def test_continue_final_message_continues_the_assistants_words(server):
    _, _, c = server
    r = c.chat.completions.create(
        model=MODEL,
        messages=CAPITAL,
        max_tokens=3,
        temperature=0,
        extra_body={"continue_final_message": True},
    )
    assert r.choices[0].message.content.startswith(" Paris"), r.choices[0].message.content


def test_prompt_lists_and_token_ids_give_the_same_greedy_text(server):
    _, state, c = server
    texts = ["The capital of France is", "1, 2, 3, 4,"]
    ids = [state.tokenizer.encode(t) for t in texts]

    def run(prompt, **kw):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, **kw)
        return [ch.text for ch in r.choices]

    alone = [run(t)[0] for t in texts]
    assert run(texts) == alone
    assert run(ids) == alone
    assert run(ids[1]) == alone[1:]
    assert run(ids, echo=True) == [t + a for t, a in zip(texts, alone, strict=True)]
