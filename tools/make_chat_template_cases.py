#!/usr/bin/env python3
"""Expected outputs for tests/unit/chat_template_cases.inc (the focused cases of
tests/unit/test_chat_template.c), rendered by jinja2 itself.

The environment is transformers' chat-template environment: when transformers
is installed its own _compile_jinja_template is used; otherwise an equivalent
one is built (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception).
Every case must render without error; each expected string is what jinja2
printed, nothing is hand-written. Errors are tested in the C test itself.

Usage: python3 tools/make_chat_template_cases.py tests/unit/chat_template_cases.inc
"""
import json
import sys

import jinja2


def make_env():
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: F401
        from transformers.utils import chat_template_utils as ctu

        return lambda src: ctu._compile_jinja_template(src)
    except Exception:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        return env.from_string


COMPILE = make_env()


def render(tpl, ctx):
    c = dict(ctx)
    c.setdefault("tools", None)
    c.setdefault("documents", None)
    c.setdefault("add_generation_prompt", False)
    return COMPILE(tpl).render(**c)


G = {}


def add(group, tpl, ctx=None):
    G.setdefault(group, []).append((tpl, ctx or {}))


CTX_MSGS = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}], "bos_token": "<s>"}
G = {}
def add(group, tpl, ctx=None):
    G.setdefault(group, []).append((tpl, ctx or {}))

# whitespace control, trim_blocks, lstrip_blocks, comments, raw
add("whitespace", "a\n{% if true %}\nb\n{% endif %}\nc\n")
add("whitespace", "  {% if true %}\n    x\n  {% endif %}\n")
add("whitespace", "a  {%- if true -%}  b  {%- endif -%}  c")
add("whitespace", "a\n\n  {{- 'x' -}}  \n\nc")
add("whitespace", "a\n  {{ 'x' }}\nb")
add("whitespace", "a\n  {# note #}\nb")
add("whitespace", "a\n  {#- note -#}\n  b")
add("whitespace", "x {% raw %}{{ y }} {% if %}{% endraw %} z")
add("whitespace", "  {% raw %}\n  {{ y }}\n  {% endraw %}\nz")
add("whitespace", "  {%+ if true %}x{% endif %}")
add("whitespace", "{% if true +%}\nx{% endif %}")
add("whitespace", "text\n")
add("whitespace", "text\n\n")
add("whitespace", "a\r\nb\rc")
add("whitespace", "{% for i in [1, 2] %}\n  - {{ i }}\n{% endfor %}\n")
add("whitespace", "\t {% if true %}tab{% endif %}")
add("whitespace", "x  {% if true %}y{% endif %}")
add("whitespace", "{%- if true %}\n\n  a\n{%- endif %}")
# scoping
add("scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}")
add("scoping", "{% for i in [1, 2] %}{% set y = i %}{% endfor %}[{{ y }}]")
add("scoping", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}")
add("scoping", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}")
add("scoping", "{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'assistant' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}", CTX_MSGS)
add("scoping", "{% with a = 1 %}{% set b = 2 %}{{ a }}{{ b }}{% endwith %}[{{ a }}{{ b }}]")
add("scoping", "{% set x %}in {{ 'block' }}{% endset %}<{{ x }}>")
add("scoping", "{% set x | upper | trim %}  shout  {% endset %}<{{ x }}>")
add("scoping", "{% set a, b = 'xy' %}{{ b }}{{ a }}")
add("scoping", "{% set x = 'outer' %}{% macro m() %}{{ x }}{% set x = 'inner' %}{{ x }}{% endmacro %}{{ m() }}{{ x }}")
# loops
add("loops", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}")
add("loops", "{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }};{% endfor %}")
add("loops", "{% for x in [] %}no{% else %}empty{% endfor %}")
add("loops", "{% for x in range(6) if x is odd %}{{ loop.index }}/{{ loop.length }}={{ x }} {% endfor %}")
add("loops", "{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}")
add("loops", "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}")
add("loops", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}")
add("loops", "{% for a, b in [(1, 2), [3, 4], 'xy'] %}{{ a }}{{ b }},{% endfor %}")
add("loops", "{% for c in 'h\u00e9\u4f60\U0001F600' %}[{{ c }}]{% endfor %}")
add("loops", "{% for x in [1, 2] %}{% for y in 'ab' %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }};{% endfor %}")
add("loops", "{% for x in range(3) %}{{ loop.cycle('odd', 'even') }}{% endfor %}")
add("loops", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}")
add("loops", "{% for m in messages[::-1] %}{{ m.role }} {% endfor %}", CTX_MSGS)
add("loops", "{% for x in missing %}a{% endfor %}b")
add("loops", "{% for k in [1, 2] %}{% break %}{% else %}else-after-break{% endfor %}|{% for k in [1, 2] %}{% continue %}{% else %}else-after-continue{% endfor %}|{% for k in [1, 2] %}{% if k == 2 %}{% continue %}{% endif %}{% else %}no{% endfor %}")
add("loops", "{% set x = 1 %}{% for k in [] %}{% else %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}")
# macros
add("macros", "{% macro m(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(c=3, a=4) }}{{ m() }}")
add("macros", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}")
add("macros", "{% macro greet(name) -%}\n  Hello {{ name }}!\n{%- endmacro %}[{{ greet('x') }}]")
add("macros", "{% macro m(x) %}{{ x }}{% endmacro %}{{ m('a') ~ m('b') }}|{{ m is callable }}")
# filters
add("filters", "{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ 'hello wORLD-foo'|title }}|{{ 'hELLO'|capitalize }}")
add("filters", "{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'c']|sort }}{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}{{ [3, 1, 2]|sort(reverse=true) }}{{ [{'n': 2}, {'n': 1}]|sort(attribute='n')|map(attribute='n')|list }}")
add("filters", "{{ [1, 2, 2, 3, 1]|unique|list }}{{ ['a', 'A', 'b']|unique|list }}{{ [{'k': 1}, {'k': 1}]|unique(attribute='k')|list }}")
add("filters", "{{ [1, 2, 3]|join(', ') }}|{{ [{'a': 1}, {'a': 2}]|map(attribute='a')|join }}|{{ ['a', 'b']|map('upper')|list }}|{{ [1, 2]|map('string')|join('-') }}")
add("filters", "{{ [1, 2, 3, 4]|select('odd')|list }}{{ [1, 2, 3, 4]|reject('odd')|list }}{{ [0, 1, '']|select|list }}")
add("filters", "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}{{ messages|rejectattr('role', 'in', ['system'])|list|length }}{{ messages|selectattr('name', 'defined')|list }}", CTX_MSGS)
add("filters", "{{ x|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ x|d('z') }}|{{ 0|default(5, boolean=true) }}")
add("filters", "{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'ab'|first }}{{ 'ab'|last }}[{{ []|first }}]|{{ 'h\u00e9'|length }}{{ [1]|count }}{{ {'a': 1}|length }}")
add("filters", "{{ '3'|int + 1 }}|{{ '3.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(5) }}|{{ 3.9|int }}|{{ ' 12 '|int }}|{{ '0x1A'|int(0, 16) }}|{{ '1.5'|float }}|{{ 'x'|float }}|{{ 2|float }}|{{ true|int }}")
add("filters", "{{ -3|abs }}|{{ -2.5|abs }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ 2.9|round(method='floor') }}|{{ 5|round }}|{{ 1234|round(-2) }}")
add("filters", "{{ {'b': 1, 'a': 2}|dictsort }}|{{ {'b': 1, 'a': 2}|dictsort(by='value') }}|{{ {'b': 1, 'a': 2}|items|list }}|{{ [1, 2, 3]|sum }}|{{ [{'v': 2}, {'v': 3}]|sum(attribute='v') }}|{{ [1, 5, 3]|max }}|{{ [4, 2, 3]|min }}|{{ ['b', 'A']|max }}")
add("filters", "{{ [1, 2]|reverse|list }}|{{ 'abc'|reverse }}|{{ 'a\u00e9'|reverse }}|{{ 'ab'|list }}|{{ {'k': 1}|list }}|{{ 42|string ~ 'x' }}")
add("filters", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}")
add("filters", "{{ 'x'|center(5) }}|{{ 'ab'|center(5) }}|{{ 'one two  three'|wordcount }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}|{{ [1, 2, 3]|batch(2, 0)|list }}")
add("filters", "{{ '<a href=\"x\">'|e }}|{{ '<a>'|safe }}|{{ ('<b>'|safe) + '<i>' }}|{{ '<b>'|safe ~ '<i>' }}|{{ '%s-%d-%.2f|%5s|%-3d|'|format('a', 3, 2.5, 'r', 7) }}")
add("filters", "{{ 'aXbXc'|replace('X', '-') }}|{{ 'aXbXc'|replace('X', '-', 1) }}|{{ 'abc'|replace('', '.') }}|{{ 'hello world, long text here'|truncate(12) }}|{{ 'hello world'|truncate(9, true) }}")
add("filters", "{{ {'a': 1}|attr('a') }}|{{ messages|map(attribute='nope', default='-')|join }}|{{ [[1, 2], [3]]|map('length')|list }}", CTX_MSGS)
# generators and dict views
add("generators", "{% if [0]|select %}always-true{% endif %}|{% set g = [1, 2, 3]|map('string') %}{{ g|list }}{{ g|list }}|{% set h = [1, 2, 3]|select %}{{ 2 in h }}{{ h|list }}|{{ [5, 6]|select|first }}")
add("generators", "{{ {'a': 1}.items() }}|{{ {'a': 1}.keys() }}|{{ {'a': 1}.values()|list }}|{{ {'a': 1}.keys()|length }}|{{ [1, 2]|map('string') is sequence }}{{ {'a': 1}.keys() is sequence }}")
add("generators", "{% set g = 3|map('string') %}lazy|{{ 0|map('upper')|list }}|{{ none|select|list }}|{{ ''|rejectattr('x')|list }}")
# tests
add("tests", "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 's' is string }}")
add("tests", "{{ {} is mapping }}{{ [] is mapping }}{{ [] is sequence }}{{ 'a' is sequence }}{{ {} is sequence }}{{ 1 is sequence }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ x is iterable }}")
add("tests", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 2 is lt 1 }}{{ 2 is ge 2 }}{{ 2 is le 1 }}")
add("tests", "{{ 'a' is in 'abc' }}{{ 3 is in [1, 2] }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ range is callable }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ none is sameas none }}{{ 'upper' is filter }}{{ 'odd' is test }}")
add("tests", "{{ x is not defined }}{{ not x is defined }}{{ 1 is not none and 2 is number }}{{ (messages[0].content is string) }}", CTX_MSGS)
# expressions
add("expressions", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7.5 % 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}")
add("expressions", "{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' * 2 }}|{{ [1] * 2 }}|{{ [1] + [2] }}|{{ 'a' + 'b' }}|{{ 1 + 1.5 }}|{{ true + 1 }}")
add("expressions", "{{ 1 if true }}|{{ 1 if false }}|{{ 1 if false else 2 }}|{{ 'a' in 'abc' }}|{{ 1 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1] }}|{{ 1 < 2 < 3 }}|{{ 1 < 2 > 3 }}")
add("expressions", "{{ not true }}{{ true and 'x' }}{{ false or 'y' }}{{ 0 or '' }}{{ [] and 1 }}{{ 1 == 1.0 }}{{ [1] == [1] }}{{ (1,) == [1] }}{{ {'a': 1} == {'a': 1} }}")
add("expressions", "{{ messages[0].content }}|{{ messages[0]['role'] }}|{{ messages|length }}|{{ messages[-1].content }}|{{ messages.0.role }}|{{ messages[1].missing }}|{{ bos_token + 'x' }}", CTX_MSGS)
add("expressions", "{{ 1_000 }}|{{ 0x1f }}|{{ 0b101 }}|{{ 0o17 }}|{{ 1.5e3 }}|{{ 2E-3 }}|{{ 'a' 'b' \"c\" }}|{{ True }}{{ None }}{{ false }}")
add("expressions", "{{ '\\x41\\u00e9\\U0001F600\\101\\d\\\\\\t|\\'\"' }}")
add("expressions", "{{ {'a': 1, 'b': 2}.b }}{{ {'items': 1}['items'] }}{{ {'k': 'v'}.get('k') }}{{ {'k': 'v'}.get('z', 'dflt') }}{{ {'k': 1}.keys()|list }}{{ {'k': 1}.values()|list }}")
# slicing
add("slicing", "{{ 'abc'[1] }}{{ 'abc'[-1] }}|{{ 'h\u00e9llo'[1:3] }}|{{ 'abcdef'[::2] }}|{{ 'abc'[::-1] }}|{{ [1, 2, 3][1:] }}|{{ [1, 2, 3][::-1] }}|{{ [1, 2, 3][:-1] }}|[{{ 'abc'[5] }}]|{{ 'abcdef'[-2:] }}|{{ 'abcdef'[4:1:-1] }}|{{ [1, 2, 3][10:] }}")
# methods
add("methods", "{{ 'a,b,,c'.split(',') }}|{{ '  a b  c '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ '  a b  '.rsplit(none, 1) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}")
add("methods", "{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nabc\\n'.lstrip('\\n') }}|{{ '  abc  '.rstrip() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'abc'.startswith('b', 1) }}")
add("methods", "{{ 'aXbX'.replace('X', '-') }}|{{ 'hello'.find('l') }}|{{ 'hello'.rfind('l') }}|{{ 'hello'.find('z') }}|{{ 'hello'.count('l') }}|{{ 'h\u00e9llo'.find('l') }}|{{ \"they're bill's\".title() }}|{{ 'aBc'.upper() }}{{ 'aBc'.lower() }}{{ 'aBc'.capitalize() }}{{ 'aBc'.swapcase() }}")
add("methods", "{{ '-'.join(['a', 'b']) }}|{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{0}{n}'.format('a', n='b') }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'ab'.islower() }}|{{ 'prefix_x'.removeprefix('prefix_') }}|{{ '7'.zfill(3) }}|{{ 'x'.ljust(3, '.') }}")
# Python's full case mapping and printf-style formatting
add("methods", "{{ 'straße'|upper }}|{{ 'ﬁne ﬂow'|upper }}|{{ 'ﬁne'|title }}|{{ 'ßa'.title() }}|{{ 'ßa'|capitalize }}|{{ 'İstanbul'|lower }}|{{ 'ΟΔΟΣ ΟΔΟΣ.'|lower }}|{{ 'ΣΑ'|lower }}|{{ 'aΣ'|lower }}|{{ 'ΌΣΟΣ'.title() }}|{{ 'ßSS'.swapcase() }}")
add("methods", "{{ 'ÀÉÎÕÜ àéîõü ĀĒĪŌŪ'|lower }}|{{ 'àéîõü ąęłńś'|upper }}|{{ 'привет мир'|title }}|{{ 'ПРИВЕТ'|lower }}|{{ 'αβγ'|upper }}")
add("filters", "{{ '%03d|%+d|% d|%-5d|%5d|%.3d|%#x|%#X|%#o|%x|%-#6x|%06.2f|%+.1e|%c|%c|%5s|%.1s|%-4r'|format(7, 3, 4, -2, -33, 5, 255, 255, 8, -255, 10, 3.14159, 12345.6, 65, 'z', 'ab', 'xyz', 'q') }}")
add("filters", "{{ '%d items at %s'|format(3, 'x') }}|{{ '%(a)s-%(b)d'|format(a='x', b=2) }}|{{ '%s' % none }}|{{ '%s%%' % 5 }}|{{ 'x' % [] }}")
# python printing
add("printing", "{{ none }}|{{ true }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 123456789.123 }}|{{ 1/3 }}|{{ -0.0 }}|{{ 10 / 4 }}|{{ 3 * 1.1 }}")
add("printing", "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}|{{ ('a',) }}{{ (1, 2) }}{{ () }}|{{ {'a': (1, 'b')} }}")
add("printing", "{{ \"it's\" }}|{{ ['it\\'s', 'a\"b', \"both'\\\"\", 'tab\\tnl\\n', '\\x01', 'h\u00e9', 'nb\\xa0sp'] }}")
add("printing", "{{ namespace(a=1) }}|{{ messages[0] }}", CTX_MSGS)
# tojson
add("tojson", "{{ {'a': '\u00e9', 'b': [1, 2.5, none, true, false], 'c': {}} | tojson }}")
add("tojson", "{{ '\u00e9\U0001F600'|tojson(ensure_ascii=true) }}|{{ 'a\\tb\\u0001\"\\\\/\\x7f'|tojson }}")
add("tojson", "{{ {'a': [1, {'b': 2}], 'c': {}, 'd': []}|tojson(indent=2) }}")
add("tojson", "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ {'a': [1]}|tojson(indent='\\t') }}|{{ {1: 'int', none: 0, true: 1}|tojson }}|{{ (1, 'x')|tojson }}")
add("tojson", "{{ tools|tojson }}|{{ tools[0]|tojson(indent=4) }}", {"tools": [{"type": "function", "function": {"name": "f", "description": "d\u00e9", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0.5}}}}}]})
add("tojson", "{{ 1.0|tojson }}|{{ 1e-7|tojson }}|{{ (0.1 + 0.2)|tojson }}|{{ 'x'|tojson|safe }}")


def c_str(s):
    r = ['"']
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            r.append("\\\\")
        elif ch == '"':
            r.append('\\"')
        elif ch == "\n":
            r.append("\\n")
        elif ch == "\t":
            r.append("\\t")
        elif ch == "?":
            r.append("\\?")  # no trigraphs
        elif o < 0x20 or o == 0x7F:
            r.append("\\%03o" % o)
        else:
            r.append(ch)
    r.append('"')
    return "".join(r)


def main():
    out = open(sys.argv[1], "w")
    out.write("/* chat_template_cases.inc — generated by tools/make_chat_template_cases.py: each expected\n"
              " * string is what jinja2 %s renders with transformers' chat-template environment.\n"
              " * {group, template, context JSON or \"\", expected} */\n" % jinja2.__version__)
    n = 0
    for group, cases in G.items():
        for tpl, ctx in cases:
            want = render(tpl, ctx)
            c = json.dumps(ctx, ensure_ascii=False) if ctx else ""
            out.write("    {%s,\n     %s,\n     %s,\n     %s},\n" % (c_str(group), c_str(tpl), c_str(c), c_str(want)))
            n += 1
    print(n, "cases", file=sys.stderr)


if __name__ == "__main__":
    main()
