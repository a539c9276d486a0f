"""Chat-template parity: the same conversations rendered by transformers'
`apply_chat_template(tokenize=False)` and by tierserve's ChatPrompter give the same string,
character for character, on the embedded model's template and on three tool-calling templates
(tests/fixtures/chat_templates: Hermes/Qwen style, Llama 3.1 JSON style, and one that uses every
feature of the environment). Errors agree too."""

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from tests.scripted_engine import char_tokenizer
from tierserve.chat.prompt import ChatPrompter
from tierserve.chat.template import ChatTemplate, ChatTemplateError, load_chat_template

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
TEMPLATES = sorted(p.name for p in FIXTURES.glob("*.jinja"))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — «quoted», naïve",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}},
}
DOCS = [
    {"title": "Alps", "text": "High mountains."},
    {"title": "Rhine", "text": "A river."},
    {"title": "Jura", "text": "Limestone."},
    {"title": "Ticino", "text": "Not shown: the loop breaks."},
]

# (name, messages, keyword arguments for both renderers)
CASES = [
    ("one user turn", [{"role": "user", "content": "Hi!"}], {"add_generation_prompt": True}),
    (
        "system and multi-turn",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ],
        {"add_generation_prompt": True},
    ),
    (
        "no generation prompt",
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
        {"add_generation_prompt": False},
    ),
    (
        "tools offered",
        [{"role": "user", "content": "Weather in Zürich?"}],
        {"tools": [WEATHER, TIME], "add_generation_prompt": True},
    ),
    (
        "tool call and result",
        [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            {"role": "tool", "tool_call_id": "call_1", "content": "second result"},
        ],
        {"tools": [WEATHER], "add_generation_prompt": True},
    ),
    (
        "documents and template kwargs",
        [{"role": "user", "content": "Summarise."}],
        {"documents": DOCS, "add_generation_prompt": True, "enable_thinking": True},
    ),
    (
        "reasoning and continue_final_message",
        [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "reasoning_content": "Easy.", "content": "The capital is"},
        ],
        {"continue_final_message": True},
    ),
    (
        "continue after a system turn, trailing space",
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour, "},
        ],
        {"continue_final_message": True, "date_string": "26 Jul 2024"},
    ),
]


def _pair(template: str):
    tk = char_tokenizer()
    ours = ChatPrompter(tk, template)
    theirs = PreTrainedTokenizerFast(
        tokenizer_object=tk.tokenizer, bos_token=tk.bos_token, eos_token=tk.eos_token
    )
    theirs.chat_template = template
    return ours, theirs


def _render_both(ours: ChatPrompter, theirs, messages, kw):
    kw = dict(kw)
    named = {k: kw.pop(k) for k in ("tools", "documents", "continue_final_message") if k in kw}
    add = kw.pop("add_generation_prompt", False)
    try:
        want = theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add, **named, **kw
        )
    except Exception as exc:  # transformers refuses: so must we
        with pytest.raises(ChatTemplateError):
            ours.render(messages, add_generation_prompt=add, **named, kwargs=kw)
        return type(exc).__name__
    got = ours.render(messages, add_generation_prompt=add, **named, kwargs=kw)
    assert got == want
    return got


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize(("name", "messages", "kw"), CASES, ids=[c[0] for c in CASES])
def test_fixture_templates_render_as_transformers_does(template, name, messages, kw):
    ours, theirs = _pair((FIXTURES / template).read_text())
    _render_both(ours, theirs, messages, kw)


def test_the_fixtures_exercise_what_they_claim():
    """The cases above are not vacuous: tools, calls, results and documents show up."""
    ours, theirs = _pair((FIXTURES / "hermes_tools.jinja").read_text())
    text = _render_both(ours, theirs, CASES[4][1], CASES[4][2])
    assert '{"city": "Zürich", "unit": "c"}' in text and "<tool_response>" in text
    ours, theirs = _pair((FIXTURES / "features.jinja").read_text())
    text = _render_both(ours, theirs, CASES[5][1], CASES[5][2])
    assert "3. Jura" in text and "Ticino" not in text and '"thinking": true' in text
    text = _render_both(ours, theirs, CASES[3][1], CASES[3][2])
    assert "\\u00ab" in text and "«" in text  # ensure_ascii=True, and the default False
    ours, theirs = _pair((FIXTURES / "llama_json_tools.jinja").read_text())
    text = _render_both(ours, theirs, CASES[7][1], CASES[7][2])
    assert text.endswith("Bonjour,") and "26 Jul 2024" in text


def test_template_errors_agree():
    ours, theirs = _pair((FIXTURES / "hermes_tools.jinja").read_text())
    bad_role = [{"role": "developer", "content": "x"}, {"role": "critic", "content": "y"}]
    assert _render_both(ours, theirs, bad_role, {}) == "TemplateError"
    ours, theirs = _pair((FIXTURES / "llama_json_tools.jinja").read_text())
    two_calls = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [CALL] * 2}]
    assert _render_both(ours, theirs, two_calls, {}) == "TemplateError"
    no_content = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]
    _render_both(ours, theirs, no_content, {"continue_final_message": True})
    both = {"continue_final_message": True, "add_generation_prompt": True}
    _render_both(ours, theirs, CASES[6][1], both)


def test_sandbox_keeps_templates_away_from_python():
    chat = [{"role": "user", "content": "x"}]
    for source in (
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{% set ns = namespace(_secret=1) %}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",  # the immutable sandbox: no mutation
    ):
        with pytest.raises(ChatTemplateError, match="sandbox forbids"):
            ChatTemplate(source).render(chat)
    assert ChatTemplate("{{ dict.__class__ }}").render(chat) == ""  # unsafe: undefined


def test_syntax_errors_and_missing_files_are_named(tmp_path):
    with pytest.raises(ChatTemplateError, match=r"line 2"):
        load_chat_template("{{ messages }}\n{% for %}")
    with pytest.raises(ChatTemplateError, match="no such file"):
        load_chat_template(str(tmp_path / "nope.jinja"))
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(f)) == "{{ messages[0].content }}"
    inline = "{% for m in messages %}" + "{{ m.content }}" * 100 + "{% endfor %}"  # no file name
    assert load_chat_template(inline) == inline


@pytest.mark.model
def test_embedded_models_template_renders_as_transformers_does():
    from tierserve.model.loader import load_model

    tk = load_model().tokenizer
    ours = ChatPrompter(tk)
    theirs = PreTrainedTokenizerFast(
        tokenizer_object=tk.tokenizer, bos_token=tk.bos_token, eos_token=tk.eos_token
    )
    theirs.chat_template = tk.chat_template
    rendered = [_render_both(ours, theirs, messages, kw) for _, messages, kw in CASES]
    assert rendered[0].startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert rendered[6].endswith("<|im_start|>assistant\nThe capital is")
    # and the token ids match transformers' tokenization of the same text
    ids = ours.encode(rendered[1])
    assert ids == theirs.apply_chat_template(
        CASES[1][1], tokenize=True, add_generation_prompt=True, return_dict=False
    )


def test_a_model_whose_own_template_uses_loop_controls_loads_and_renders():
    """ChatTokenizer used to compile the model's template in a plain Jinja environment at load,
    so a template with {% break %} failed before tierserve.chat ever saw it."""
    from tests.fake_engine import tiny_tokenizer
    from tierserve.chat.prompt import ChatPrompter
    from tierserve.model.tokenizer import ChatTokenizer

    src = (
        "{% for m in messages %}{{ m['content'] }}"
        "{% if loop.index == 1 %}{% break %}{% endif %}{% endfor %}"
    )
    base = tiny_tokenizer()
    tok = ChatTokenizer(base.tokenizer, src, None, "</s>")
    msgs = [{"role": "user", "content": "w1"}, {"role": "user", "content": "w2"}]
    assert ChatPrompter(tok).render(msgs, add_generation_prompt=False) == "w1"
