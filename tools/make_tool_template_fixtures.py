#!/usr/bin/env python3
"""Fixtures for tests/unit/test_prompt_tools.c: chats with tools and tool-call histories, as an
OpenAI client sends them, and what the real chat templates of Qwen3 and GLM-4.5
(tests/golden/templates/*.jinja) render for them.

Each chat is written in the OpenAI request form (tool-call arguments as JSON text, content null
beside calls) and rendered with the arguments as objects, the form transformers' documentation
asks for and the one GLM-4.5's template can iterate (Qwen3's prints either). Rendered by
transformers' apply_chat_template where transformers is installed (the GPU machine: 5.17), else by
jinja2 in transformers' chat-template environment (as tools/make_chat_template_cases.py); each
record names its renderer. Nothing is hand-written.

tool_choice "none": the server renders no tools (server/prompt_build.c), so the expected text is
the template's without tools. chat_template_kwargs are the template's variables.

Usage: python3 tools/make_tool_template_fixtures.py OUT.jsonl
"""
import copy
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEMPLATES = {
    "qwen3": os.path.join(ROOT, "tests/golden/templates/qwen3_chat_template.jinja"),
    "glm45": os.path.join(ROOT, "tests/golden/templates/glm45_chat_template.jinja"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web (résumé, 東京)",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}}}}}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def chats():
    ask = {"role": "user", "content": "What's the weather in Paris?"}
    c = []
    c.append(dict(messages=[ask], tools=[WEATHER]))
    c.append(dict(messages=[{"role": "system", "content": "You are terse."}, ask], tools=[WEATHER, SEARCH, NOW]))
    c.append(dict(messages=[
        {"role": "system", "content": "You can call tools."}, ask,
        {"role": "assistant", "content": None, "tool_calls": [
            call("call_1", "get_weather", {"city": "Paris", "unit": "celsius", "days": 2}),
            call("call_2", "search", {"query": "Paris \"events\"\nthis week", "filters": {"lang": ["fr", "en"], "max": 5},
                                      "tags": ["été", "東京"]})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "No events found."},
        {"role": "user", "content": "And tomorrow?"}], tools=[WEATHER, SEARCH]))
    c.append(dict(messages=[
        ask,
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "The user wants Paris.",
         "tool_calls": [call("call_9", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_9", "name": "get_weather", "content": "18 C"}], tools=[WEATHER]))
    c.append(dict(messages=[
        ask, {"role": "assistant", "content": None, "tool_calls": [call("call_3", "now", {})]},
        {"role": "tool", "tool_call_id": "call_3", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
        {"role": "user", "content": "Thanks"}], tools=[WEATHER, NOW], chat_template_kwargs={"enable_thinking": False}))
    c.append(dict(messages=[ask], tools=[WEATHER], tool_choice="none"))
    c.append(dict(messages=[ask, {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", {"city": "Oslo"})]},
                            {"role": "tool", "tool_call_id": "c", "content": "-3 C"}], tools=[WEATHER], tool_choice="none"))
    return c


def openai_form(chat):
    """The request a client sends: arguments as compact JSON text (its spacing must not matter)."""
    req = copy.deepcopy(chat)
    for m in req["messages"]:
        for t in m.get("tool_calls") or []:
            t["function"]["arguments"] = json.dumps(t["function"]["arguments"], separators=(",", ":"), ensure_ascii=False)
    return req


def template_form(chat):
    """What the template gets: arguments as objects, content "" beside calls."""
    msgs = copy.deepcopy(chat["messages"])
    for m in msgs:
        if m.get("content") is None:
            m["content"] = ""
    tools = None if chat.get("tool_choice") == "none" else chat.get("tools")
    return msgs, tools, chat.get("chat_template_kwargs") or {}


def renderer():
    try:
        import transformers
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "models/moeserve-tiny/tokenizer.json"))

        def render(src, msgs, tools, kwargs):
            return tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False,
                                           chat_template=src, **kwargs)
        return render, f"transformers {transformers.__version__} apply_chat_template"
    except ImportError:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception

        def render(src, msgs, tools, kwargs):
            return env.from_string(src).render(messages=msgs, tools=tools, documents=None, add_generation_prompt=True,
                                               **kwargs)
        return render, f"jinja2 {jinja2.__version__} in transformers' chat-template environment"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    render, who = renderer()
    n = 0
    with open(sys.argv[1], "w") as f:
        for name, path in TEMPLATES.items():
            src = open(path, encoding="utf-8").read()
            for chat in chats():
                msgs, tools, kwargs = template_form(chat)
                rec = dict(template=name, request=openai_form(chat), renderer=who,
                           rendered=render(src, msgs, tools, kwargs))
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
    print(f"{n} chats rendered by {who}")


if __name__ == "__main__":
    main()
