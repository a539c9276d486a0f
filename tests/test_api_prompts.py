"""Completions with a list of prompts and with token-id prompts, through the official `openai`
client on the fake engine (whose output is a function of the prompt, so each choice can be
traced back to its prompt): prompt i's choice j has index i * n + j."""

import openai
import pytest

from tests.fake_engine import fake_built, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.api.protocol import MAX_PROMPTS

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [words(3, start=10), words(5, start=40), words(2, start=500)]


@pytest.fixture(scope="module")
def client():
    with running_server(fake_built(max_model_len=64)) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def complete(c, prompt, **kw):
    return c.completions.create(model=MODEL, prompt=prompt, max_tokens=4, seed=3, **kw)


def ids(text: str) -> list[int]:
    return tiny_tokenizer().encode(text)


def test_a_list_of_prompts_gets_n_choices_each_in_openai_order(client):
    alone = [[ch.text for ch in complete(client, p, n=2).choices] for p in PROMPTS]
    assert len({texts[0] for texts in alone}) == 3  # the prompts give different answers
    r = complete(client, PROMPTS, n=2)
    assert [ch.index for ch in r.choices] == list(range(6))
    assert [ch.text for ch in r.choices] == [t for texts in alone for t in texts]
    assert r.usage.prompt_tokens == 3 + 5 + 2  # each prompt once, as OpenAI counts
    assert r.usage.completion_tokens == sum(4 for _ in r.choices)


def test_token_id_prompts_equal_their_text(client):
    texts = [ch.text for ch in complete(client, PROMPTS).choices]
    by_ids = complete(client, [ids(p) for p in PROMPTS])
    assert [ch.text for ch in by_ids.choices] == texts
    one = complete(client, ids(PROMPTS[1]))
    assert one.choices[0].text == texts[1] and one.usage.prompt_tokens == 5


def test_echo_gives_each_prompt_back_token_ids_as_text(client):
    plain = complete(client, [PROMPTS[0], PROMPTS[2]])
    r = complete(client, [PROMPTS[0], PROMPTS[2]], echo=True)
    assert r.choices[0].text == PROMPTS[0] + plain.choices[0].text
    r = complete(client, [ids(PROMPTS[0]), ids(PROMPTS[2])], echo=True)
    assert r.choices[1].text == PROMPTS[2] + plain.choices[1].text


def test_streamed_lists_carry_every_index(client):
    whole = complete(client, PROMPTS, n=2)
    texts: dict[int, str] = {}
    finish = {}
    for chunk in complete(client, PROMPTS, n=2, stream=True, echo=True):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert sorted(texts) == list(range(6)) and len(finish) == 6
    for k, ch in enumerate(whole.choices):
        assert texts[k] == PROMPTS[k // 2] + ch.text


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [
        ([[1, 2], []], "prompt 1 is empty"),
        (["w1", ""], "prompt 1 is empty"),
        ([[1, 2], [3, 5000]], "prompt 1: token ids must lie in [0, 1000)"),
        ([words(3), words(70)], "prompt 1 has 70 tokens"),
        (["w1"] * (MAX_PROMPTS + 1), f"at most {MAX_PROMPTS} prompts"),
        ([1, "w1"], "not a mix"),
        (["w1", [1]], "not a mix"),
    ],
)
def test_bad_prompt_lists_are_400s_naming_the_prompt(client, prompt, needle):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, prompt)
    assert needle in info.value.body["message"]
    assert info.value.body["param"].startswith("prompt")


def test_a_list_is_admitted_as_a_whole(client):
    """Context checks cover every prompt before anything is submitted."""
    with pytest.raises(openai.BadRequestError, match="60 for the completion"):
        c = client
        c.completions.create(model=MODEL, prompt=[words(2), words(10)], max_tokens=60)
