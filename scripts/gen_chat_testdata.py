#!/usr/bin/env python3
"""Render chat-template test cases with Python jinja2, set up the way
transformers' apply_chat_template sets it up, and write the expectations
for mkserve's chat package to chat/testdata/cases.json.

Environment (as transformers.utils.chat_template_utils): an
ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and
the loopcontrols extension; globals raise_exception and strftime_now; the
tojson filter replaced by json.dumps(ensure_ascii=False, ...). strftime_now
reports a fixed time so the output is reproducible. Variables: messages,
tools (None without tools), documents (None), add_generation_prompt, the
special tokens given, and extra kwargs.

Templates are chat/testdata/templates/*.jinja (written for these tests in
the style of Mixtral, Qwen3, DeepSeek-V3 and gpt-oss) or inline sources for
lexer and expression corner cases.

Run from the repository root: python3 scripts/gen_chat_testdata.py
"""

import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TDIR = os.path.join(ROOT, "chat", "testdata")
NOW = datetime.datetime(2025, 3, 14, 15, 9, 26)

# Key order of message dicts on the Go side; the JSON below must follow it.
MSG_KEYS = ["role", "content", "reasoning_content", "thinking", "tool_calls", "name", "tool_call_id"]


class GenerationTracker(Extension):
    """transformers' AssistantTracker without the mask bookkeeping: the
    {% generation %} block just renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def user(c):
    return {"role": "user", "content": c}


def assistant(c, **kw):
    m = {"role": "assistant", "content": c}
    m.update(kw)
    return m


def system(c):
    return {"role": "system", "content": c}


def tool(c, **kw):
    m = {"role": "tool", "content": c}
    m.update(kw)
    return m


def call(name, args, id=None, type="function"):
    c = {}
    if id is not None:
        c["id"] = id
    if type is not None:
        c["type"] = type
    c["function"] = {"name": name, "arguments": args}
    return c


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web <fast> & \"exact\"",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "after": {"type": "number"}, "safe": {"type": "boolean"}},
                },
                "tags": {"type": "array", "items": {"type": "string"}},
                "weights": {"type": "array", "items": {"type": "number"}},
            },
            "required": ["query", "tags"],
        },
    },
}
NOARGS = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}

TRICKY = 'Quotes " and \' and \\ backslash, tab\t, ctrl \u0001\u001f, 😀 emoji, 中文, é, \u2028 sep, </s> <|im_end|>'

CASES = []


def case(name, messages, template=None, source=None, **opts):
    for m in messages:
        keys = list(m.keys())
        assert keys == [k for k in MSG_KEYS if k in m], f"{name}: message keys {keys} out of order"
    c = {"name": name}
    if template:
        c["template"] = template
    else:
        c["source"] = source
    c["messages"] = messages
    c["options"] = opts
    CASES.append(c)


# --- Mixtral style
conv = [user("Hello!"), assistant("Hi, how can I help?"), user("  Tell me a joke.  ")]
case("mixtral/basic", conv, "mixtral.jinja", bos_token="<s>", eos_token="</s>")
case("mixtral/system", [system("You are terse.")] + conv, "mixtral.jinja", bos_token="<s>", eos_token="</s>")
case("mixtral/unicode", [user(TRICKY), assistant("✓ " + TRICKY)], "mixtral.jinja", bos_token="<s>", eos_token="</s>")
case("mixtral/alternation-error", [user("a"), user("b")], "mixtral.jinja", bos_token="<s>", eos_token="</s>")
case("mixtral/role-error", [user("a"), assistant("b"), {"role": "tool", "content": "c"}], "mixtral.jinja", bos_token="<s>", eos_token="</s>")
case("mixtral/no-bos", conv, "mixtral.jinja", eos_token="</s>")

# --- Qwen3 style
case("qwen3/plain", [system("You are Qwen."), user("Hi"), assistant("Hello."), user("2+2?")], "qwen3.jinja", add_generation_prompt=True)
case("qwen3/no-system", [user("Hi")], "qwen3.jinja", add_generation_prompt=True)
case("qwen3/thinking-off", [user("Hi")], "qwen3.jinja", add_generation_prompt=True, kwargs={"enable_thinking": False})
case("qwen3/thinking-on", [user("Hi")], "qwen3.jinja", add_generation_prompt=True, kwargs={"enable_thinking": True})
case("qwen3/reasoning", [user("Why?"), assistant("Because.", reasoning_content="\nThe user asks why.\n"), user("And then?"),
                         assistant("<think>\nstep one\n</think>\n\nThen this.")], "qwen3.jinja")
case("qwen3/tools", [system("Use tools wisely."), user("Weather in Paris and Tokyo?"),
                     assistant("", tool_calls=[call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}, id="c1"),
                                               call("get_weather", {"city": "東京", "precision": 0.5, "hourly": True, "extra": None, "nested": {"a": [1, 2.0, 1e-07, 1e+21]}}, id="c2")]),
                     tool('{"temp": 21}', tool_call_id="c1"), tool("Sunny, 25°C", tool_call_id="c2"),
                     assistant("Paris is 21 and Tokyo 25.", reasoning_content="Combine the two results.")],
     "qwen3.jinja", tools=[WEATHER, SEARCH], add_generation_prompt=True)
case("qwen3/string-args", [user("search"), assistant("Searching.", tool_calls=[call("search", '{"query": "go", "tags": []}', type=None)]),
                           tool("<tool_response>none</tool_response>")], "qwen3.jinja", tools=[SEARCH])
case("qwen3/multi-step", [user("q"), assistant(None, tool_calls=[call("now", {})]), tool("12:00"),
                          user("<tool_response>fake</tool_response>")], "qwen3.jinja", add_generation_prompt=True)

# --- DeepSeek-V3 style
case("deepseek3/chat", [system("Be brief."), system("Answer in English."), user("Hi"), assistant("<think>greet</think>  Hello!"), user("Bye")],
     "deepseek3.jinja", bos_token="<｜begin▁of▁sentence｜>", add_generation_prompt=True)
case("deepseek3/tools", [user("Weather?"), assistant(None, tool_calls=[call("get_weather", '{"city": "Paris"}'), call("get_weather", '{"city": "Rome"}')]),
                         tool("21C"), tool("25C"), assistant("Paris 21, Rome 25.")],
     "deepseek3.jinja", bos_token="<｜begin▁of▁sentence｜>", add_generation_prompt=True)
case("deepseek3/pending-tool", [user("Weather?"), assistant(None, tool_calls=[call("get_weather", '{"city": "Oslo"}')]), tool("-3C")],
     "deepseek3.jinja", bos_token="<｜begin▁of▁sentence｜>", add_generation_prompt=True, kwargs={"thinking": True})
case("deepseek3/thinking", [user("Hi")], "deepseek3.jinja", bos_token="<｜begin▁of▁sentence｜>", add_generation_prompt=True, kwargs={"thinking": True})

# --- gpt-oss style (harmony)
case("gptoss/basic", [user("What is 2+2?")], "gptoss.jinja", add_generation_prompt=True)
case("gptoss/effort-high", [system("  Answer in French.  "), user("Bonjour"), assistant("Salut !", thinking="Greet back.")],
     "gptoss.jinja", kwargs={"reasoning_effort": "high"})
case("gptoss/tools", [system("Use the tools."), user("Weather in Paris?"),
                      assistant(None, thinking="Need weather.", tool_calls=[call("get_weather", {"city": "Paris"})]),
                      tool('{"temp": 21, "sky": "clear"}'), assistant("21 and clear.", thinking="Report it.")],
     "gptoss.jinja", tools=[WEATHER, SEARCH, NOARGS], add_generation_prompt=True, kwargs={"reasoning_effort": "low"})
case("gptoss/tools-no-system", [user("Find go docs")], "gptoss.jinja", tools=[SEARCH], add_generation_prompt=True)
case("gptoss/bad-effort", [user("x")], "gptoss.jinja", kwargs={"reasoning_effort": "extreme"})
case("gptoss/orphan-tool", [user("x"), tool("y")], "gptoss.jinja")

# --- trim_blocks / lstrip_blocks without markers
case("plain/basic", [system("sys"), user("hi"), assistant("yo")], "plain.jinja", eos_token="</s>", add_generation_prompt=True)
case("plain/no-prompt", [user("hi")], "plain.jinja", eos_token="</s>")

# --- lexer corner cases (inline)
LEX = {
    "crlf": "A\r\n{% if true %}\r\n  B\r\n{% endif %}\r\nC\r\n",
    "cr-only": "A\r{% if true %}\rB\r{% endif %}\r",
    "trailing-newlines": "x\n\n",
    "lstrip-after-var": "{{ 'a' }}   {% if true %}b{% endif %}",
    "dash-after-var": "line\n   {{ 'v' }}{%- if true %}w{% endif %}",
    "dash-both": "{%- set x = 1 -%}\n\n  {{ x }}  \n{#- c -#}  end",
    "empty-dash-comment": "a  {#-#}  b",
    "plus-comment": "a  {#+ keep +#}\n  b",
    "raw": "x {% raw -%}  {{ y }} {%- endraw %} z\n  {% raw %}\n  a\n  {% endraw %}\nq",
    "unicode-space": "x\u3000\u2003{%- if true %}y{% endif %}",
    "isspace-1c": "x\x1c{%- if true %}y{% endif %}",
    "nested-braces": "{{ {'a': {'b': 1}} }}|{{ {'a': 1}['a'] }}",
    "braces-in-strings": "{{ '}}' ~ \"%}\" ~ '{{' }}|{% if '%}' %}ok{% endif %}",
    "block-newline": "{% if true %}\n\nx{% endif %}\n\ny",
    "indented-blocks": "  {% for i in range(2) %}\n    {{ i }}\n  {% endfor %}\n",
    "var-dash-newline": "a {{- 'b' -}} \n c",
    "plus-block": "  {%+ if true %}x{% endif +%}\ny",
    "comment-newline": "{# c #}\nx\n  {# indented #}\ny",
    "dash-var-then-block": "{{ 'q' -}}\n   {% if true %}z{% endif %}",
    "generation": "{% generation %}G{% endgeneration %}!",
}
for k, v in LEX.items():
    case("lex/" + k, [], source=v)

# --- expressions and filters (inline)
D = {"b": 1, "a": [1, 2.5, None, True], "c": {"x": "y"}}
EXPR = {
    "print-values": "{{ none }}|{{ 1.0 }}|{{ 2.5e-7 }}|{{ 1e16 }}|{{ 123456789.125 }}|{{ [1, 'a', none, true, 1.5] }}|{{ {'k': 'v', 'n': none} }}|{{ \"it's\" }}|{{ ['it\\'s', 'q\"'] }}|{{ true }}",
    "arith": "{{ 7 // 2 }} {{ 7 / 2 }} {{ 7 % 3 }} {{ 1 + 2 * 3 }} {{ 10 - 2 - 3 }} {{ 4 / 2 }} {{ 1_000 + 1 }} {{ 1.5e3 }}",
    "string-filters": "{{ 'Hello World' | lower }} {{ 'hello world' | title }} [{{ '  pad  ' | trim }}] {{ 'abc' | upper }} {{ 'x' * 3 }} {{ 'hello' | capitalize }} {{ 'a-b' | replace('-', '+') }}",
    "list-filters": "{{ [3, 1, 2] | sort | join(',') }} {{ [1, 2, 3] | sum }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ ['a', 'b'] | length }} {{ [1, 2, 2, 1] | unique | list | length }} {{ [1, 2, 3] | reverse | list }} {{ [4, 9] | max }} {{ [4, 9] | min }}",
    "map": "{{ ['a', 'b'] | map('upper') | join(',') }} {{ messages | map(attribute='role') | join('/') }} {{ [1, 'x'] | map('tojson') | join(' ') }} {{ messages | map(attribute='missing', default='-') | join() }}",
    "select": "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join }} {{ [1, 2, 3, 4] | select('even') | list }}",
    "range": "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}",
    "string-methods": "{{ 'a,b,c'.split(',') }} {{ 'a b  c'.split() }} {{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }} {{ 'Ab'.startswith('A') }} {{ 'Ab'.endswith('b') }} {{ 'a-b'.replace('-', '+') }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }}",
    "slices": "{{ 'abc'[::-1] }} {{ 'abcdef'[1:4] }} {{ [1, 2, 3, 4][-2:] }} {{ [1, 2, 3, 4][:-1] }} {{ [1, 2, 3, 4][::2] }} {{ 'abc'[-1] }}",
    "tests": "{{ d is mapping }} {{ d is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ none is none }} {{ 'x' is string }} {{ 1 is number }} {{ d.a is sequence }} {{ nope is undefined }} {{ d is defined }} {{ 1 is integer }} {{ 1.5 is float }} {{ true is boolean }}",
    "default": "{{ none | default('d') }}|{{ nope | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ nope | d('x') }}",
    "concat": "{{ 'a' ~ 1 ~ true }} {{ [1, 2] + [3] }} {{ 'ab' + 'cd' }}",
    "dict": "{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys() | list }} {{ d.get('b') }} {{ d.get('zz', 'def') }} {{ d['c']['x'] }} {{ d.c.x }} {{ 'b' in d }}",
    "loopcontrols": "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{{ ',' if not loop.last }}{% endfor %}",
    "loop-vars": "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }} {% endfor %}",
    "loop-else": "{% for x in [] %}x{% else %}empty{% endfor %}",
    "macro": "{% macro m(x, y='Y') %}[{{ x }}{{ y }}]{% endmacro %}{{ m('a') }}{{ m('b', 'c') }}{{ m(x='d') }}",
    "namespace": "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "set-scope": "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}",
    "set-scope-conditional": "{% for i in range(4) %}{% if i is even %}{% set last = i %}{% endif %}[{{ last | default('-') }}]{% endfor %}{{ last is defined }}",
    "set-scope-nested": "{% set a = 'o' %}{% for i in range(2) %}{% set a = a ~ i %}{% for j in range(2) %}{% set a = a ~ 'j' %}{% set b = j %}{{ a }}{% endfor %}{{ a }}{{ b | default('-') }};{% endfor %}{{ a }}",
    "set-block-in-loop": "{% for i in range(3) %}{% if i > 0 %}{% set prev %}<{{ i - 1 }}>{% endset %}{% endif %}{{ prev | default('none') }}{% endfor %}",
    "set-in-macro-in-loop": "{% macro m(v) %}{% set w = v * 2 %}{{ w }}{% endmacro %}{% for i in range(3) %}{{ m(i) }}{% set w = 'L' ~ i %}{{ w }}{% endfor %}{{ w | default('-') }}",
    "filter-block": "{% filter upper %}shout {{ 'this' }}{% endfilter %}",
    "if-elif": "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}",
    "tojson-variants": "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(separators=(',', ':')) }}\n{{ d | tojson(sort_keys=true) }}\n{{ 'é😀\u0001' | tojson }}\n{{ 'é😀\u0001' | tojson(ensure_ascii=true) }}\n{{ [] | tojson(indent=4) }} {{ {} | tojson }}",
    "tojson-tricky": "{{ tricky | tojson }} {{ [1.0, 1e-7, 1e21, 0.1, -2.5, 100] | tojson }}",
    "strftime": "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%-d %B, %A %I:%M %p') }}|{{ strftime_now('%j %y %a') }}",
    "raise": "before{{ raise_exception('boom: ' ~ 42) }}after",
    "inline-if": "{{ 'yes' if none else 'no' }} {{ 'a' if 1 > 0 }}|{{ 'b' if 0 > 1 }}|",
    "comparisons": "{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ [1] == [1] }} {{ not 0 }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ 2 in [1, 2] }} {{ 'x' not in 'abc' }}",
    "filter-precedence": "{{ 'a' ~ 'B' | lower }} {{ (-2) | abs }} {{ ['x'] | join + 'y' }}",
    "whitespace-filters": "{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a b c' | wordcount }}",
    "numbers": "{{ '42' | int + 1 }} {{ '3.5' | float }} {{ 3.7 | int }} {{ 2.6 | round }} {{ 3.14159 | round(2) }} {{ 10 | string ~ 'x' }}",
    "items-filter": "{% for k, v in d | items %}{{ k }}:{{ v | tojson }} {% endfor %}",
    "batch": "{{ [1, 2, 3, 4, 5] | batch(2) | list }}",
    "string-iter": "{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "messages-access": "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].content | length }} {{ messages | length }}",
}
for k, v in EXPR.items():
    case("expr/" + k, [user("first"), assistant("second"), user("third ✓")], source=v,
         kwargs={"d": D, "tricky": TRICKY})

# --- known differences of the Go renderer (github.com/ardanlabs/jinja
# underneath), kept so the Go test notices if one goes away. The chat
# package doc lists them.
GAPS = {
    "pow-is-float": ("{{ 2 ** 10 }}", "** gives a float"),
    "floordiv-negative": ("{{ -7 // 2 }}", "// truncates toward zero"),
    "split-maxsplit": ("{{ 'a1b1'.split('1', 1) }}", "str.split ignores maxsplit"),
    "concat-none-float": ("{{ 'a' ~ none ~ 2.0 }}", "~ prints None as '' and 2.0 as 2"),
    "tuple-repr": ("{{ d | dictsort }}", "tuples print as lists"),
    "unary-minus-filter": ("{{ -2 | abs }}", "a filter binds tighter than unary minus"),
    "round-half-even": ("{{ 2.5 | round }}", "round rounds half away from zero"),
    "undefined-attr": ("{{ nope.attr }}", "attribute of an undefined value is undefined, not an error"),
}
for k, (v, why) in GAPS.items():
    case("gap/" + k, [user("x")], source=v, kwargs={"d": D})
    CASES[-1]["known_gap"] = why


def render(env, c):
    src = c.get("source")
    if src is None:
        with open(os.path.join(TDIR, "templates", c["template"]), encoding="utf-8", newline="") as f:
            src = f.read()
    o = c["options"]
    variables = {
        "messages": c["messages"],
        "tools": o.get("tools"),
        "documents": None,
        "add_generation_prompt": o.get("add_generation_prompt", False),
    }
    for k in ("bos_token", "eos_token"):
        if k in o:
            variables[k] = o[k]
    variables.update(o.get("kwargs", {}))
    try:
        return {"output": env.from_string(src).render(**variables)}
    except jinja2.exceptions.TemplateSyntaxError as ex:
        return {"error": str(ex), "error_type": "TemplateSyntaxError"}
    except jinja2.exceptions.UndefinedError as ex:
        return {"error": str(ex), "error_type": "UndefinedError"}
    except jinja2.exceptions.TemplateError as ex:
        return {"error": str(ex), "error_type": "TemplateError"}
    except Exception as ex:  # Python errors inside the template (TypeError, ...)
        return {"error": f"{type(ex).__name__}: {ex}", "error_type": type(ex).__name__}


def main():
    env = make_env()
    out = []
    for c in CASES:
        r = render(env, c)
        c = dict(c)
        c.update(r)
        out.append(c)
    path = os.path.join(TDIR, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "now": NOW.isoformat(), "cases": out}, f, ensure_ascii=False, indent=1)
    errors = sum(1 for c in out if "error" in c)
    print(f"jinja2 {jinja2.__version__}: {len(out)} cases ({errors} expected errors) -> {os.path.relpath(path, ROOT)}")
    for c in out:
        if "error" in c:
            print(f"  {c['name']}: {c['error_type']}: {c['error']}")


if __name__ == "__main__":
    sys.exit(main())
