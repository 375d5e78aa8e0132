// The Jinja subset through ChatTemplate's public API: each construct, whitespace control, Python
// str() of values and transformers' tojson against outputs recorded from Python jinja2 as
// transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols), generation spans in bytes, and errors that name the line and column.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "loongforge/core/error.h"
#include "loongforge/data/chat_template.h"

namespace {

using lf::data::ChatTemplate;

// Renders src with the variables of ctx (a JSON object); "messages" becomes the conversation's.
lf::data::ChatRender render_full(const std::string& src, const std::string& ctx) {
  auto vars = nlohmann::ordered_json::parse(ctx);
  nlohmann::ordered_json conv = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  if (vars.contains("messages")) {
    conv["messages"] = vars["messages"];
    vars.erase("messages");
  }
  ChatTemplate t(src, "test.jinja");
  t.set_template_kwargs(vars.dump());
  return t.render(conv.dump(), false);
}

std::string render(const std::string& src, const std::string& ctx = "{}") { return render_full(src, ctx).text; }

// The lf::Error message of rendering src, or "" when it renders.
std::string error_of(const std::string& src, const std::string& ctx = "{}") {
  try {
    render(src, ctx);
  } catch (const lf::Error& e) {
    return e.message();
  }
  return "";
}

TEST(Jinja, PythonValuesPrintAsStr) {
  EXPECT_EQ(render(R"~({{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 2 }} {{ 3 * 'ab' }} {{ 1.5 * 2 }} {{ 10 / 4 }} {{ 2 ** -1 }})~",
                   R"~({})~"),
            R"~(3 3 -4 -2 1024 0.5 ababab 3.0 2.5 0.5)~");
  EXPECT_EQ(render(R"~({{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.0 }} {{ 1.0 }} {{ 2.5e15 }} {{ -0.0 }} {{ 1_000 }})~",
                   R"~({})~"),
            R"~(0.30000000000000004 1e+16 1e-05 123456789.0 1.0 2500000000000000.0 -0.0 1000)~");
  EXPECT_EQ(render(R"~({{ [1, 'a', none, true, 1.5, {'k': [1,2]}, (1,), (1,2), ()] }})~",
                   R"~({})~"),
            R"~([1, 'a', None, True, 1.5, {'k': [1, 2]}, (1,), (1, 2), ()])~");
  EXPECT_EQ(render(R"~({{ {'a': "it's", 'b': 'say "hi"', 'c': 'both \' "', 'd': 'tab\tnl\n'} }})~",
                   R"~({})~"),
            R"~({'a': "it's", 'b': 'say "hi"', 'c': 'both \' "', 'd': 'tab\tnl\n'})~");
  EXPECT_EQ(render(R"~({{ x }}|{{ none }}|{{ True }}|{{ False }}|{{ undefined_name }}|{{ d }}|{{ l }})~",
                   R"~({"x": null, "d": {"k": "v", "n": 1.5, "b": false}, "l": ["x", "y"]})~"),
            R"~(None|None|True|False||{'k': 'v', 'n': 1.5, 'b': False}|['x', 'y'])~");
  EXPECT_EQ(render(R"~({{ 'a' 'b' }}{{ "\u00e9\x41\101" }}{{ 'ab' ~ 3 ~ none }}{{ [1,2] + [3] }}{{ (1, 2) }})~",
                   R"~({})~"),
            R"~(abéAAab3None[1, 2, 3](1, 2))~");
}

TEST(Jinja, Statements) {
  EXPECT_EQ(render(R"~({% for k, v in d.items() %}{{ loop.index }}:{{ k }}={{ v }}{% if not loop.last %},{% endif %}{% endfor %})~",
                   R"~({"d": {"b": 1, "a": 2, "c": [1, 2]}})~"),
            R"~(1:b=1,2:a=2,3:c=[1, 2])~");
  EXPECT_EQ(render(R"~({% for m in ms if m.r != 'x' %}{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.previtem }}/{{ loop.nextitem }} {% else %}empty{% endfor %})~",
                   R"~({"ms": [{"r": "a"}, {"r": "x"}, {"r": "b"}, {"r": "c"}]})~"),
            R"~(0/3/3/2/True/False//{'r': 'b'} 1/3/2/1/False/False/{'r': 'a'}/{'r': 'c'} 2/3/1/0/False/True/{'r': 'b'}/ )~");
  EXPECT_EQ(render(R"~({% for m in [] %}x{% else %}empty{% endfor %}{% for x in undefined_list %}y{% endfor %})~",
                   R"~({})~"),
            R"~(empty)~");
  EXPECT_EQ(render(R"~({% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %})~",
                   R"~({})~"),
            R"~(0134)~");
  EXPECT_EQ(render(R"~({% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %})~",
                   R"~({})~"),
            R"~(1234[h][é]xy)~");
  EXPECT_EQ(render(R"~({% for x in [1] %}{% for y in [2, 3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}{{ loop is defined }})~",
                   R"~({})~"),
            R"~(121False)~");
  EXPECT_EQ(render(R"~({% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a %}{% if b %}nested{% endif %}{% endif %})~",
                   R"~({"a": 0, "b": "x"})~"),
            R"~(Bnested)~");
  EXPECT_EQ(render(R"~({% set ns = namespace(a=1, found=false) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% set x = i %}{% endfor %}{{ ns.a }} {{ x }})~",
                   R"~({})~"),
            R"~(4 )~");
  EXPECT_EQ(render(R"~({% set x = 'outer' %}{% for i in range(2) %}{{ x }}{% set x = 'in' ~ i %}{{ x }}{% endfor %}{{ x }})~",
                   R"~({})~"),
            R"~(outerin0outerin1outer)~");
  EXPECT_EQ(render(R"~({% if true %}{% set y = 5 %}{% endif %}{{ y }}{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }})~",
                   R"~({})~"),
            R"~(512(1, 2))~");
  EXPECT_EQ(render(R"~({% set blk %}  hello {{ 1 }} {% endset %}[{{ blk }}])~",
                   R"~({})~"),
            R"~([  hello 1 ])~");
  EXPECT_EQ(render(R"~({% macro f(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(1, c=3) }}{{ f(a=4) }})~",
                   R"~({})~"),
            R"~(<1|B|None><1|2|None><1|B|3><4|B|None>)~");
  EXPECT_EQ(render(R"~({% macro render(m) %}{{ m.role }}: {{ m.content }}{% endmacro %}{% for m in ms %}{{ render(m) }};{% endfor %})~",
                   R"~({"ms": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})~"),
            R"~(user: hi;assistant: yo;)~");
  EXPECT_EQ(render(R"~({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }})~",
                   R"~({})~"),
            R"~(3)~");
  EXPECT_EQ(render(R"~({{ 'x' if a else 'y' }}{{ 'z' if b }}|{{ a or b }}|{{ a and b }}|{{ not a }})~",
                   R"~({"a": 0, "b": "B"})~"),
            R"~(yz|B|0|True)~");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render(R"~(  {% if true %}
  x
  {% endif %}
  y {{ 1 }}
{# comment #}
z
{%- if true -%}
  w  
{%- endif %}
{%+ if true %}keep{% endif +%}
last
)~",
                   R"~({})~"),
            R"~(  x
  y 1
zwkeep
last)~");
  EXPECT_EQ(render(R"~(a  {{- 'b' -}}  c
  {%- for i in [1, 2] %}
    {{ i }}
  {%- endfor %}
end)~",
                   R"~({})~"),
            R"~(abc    1    2end)~");
  EXPECT_EQ(render(R"~({% for m in ms %}
    {%- if m %}
        {{- m }}
    {%- endif %}
{%- endfor %}
)~",
                   R"~({"ms": ["a", "", "b"]})~"),
            R"~(ab)~");
  EXPECT_EQ(render(R"~(line
    {# indented comment #}
next {{ 'v' }}  
  {{ 'w' }}

)~",
                   R"~({})~"),
            R"~(line
next v  
  w
)~");
}

TEST(Jinja, StringMethodsAndSlices) {
  EXPECT_EQ(render(R"~({{- '  a  ' | trim }}|{{ '  a  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ '\n\nx\n'.lstrip('\n') }}|)~",
                   R"~({})~"),
            R"~(a|a|a|a | a|x
|)~");
  EXPECT_EQ(render(R"~({{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'x</think>y'.split('</think>')[-1] }})~",
                   R"~({})~"),
            R"~(['a', 'b', '', 'c'] ['a', 'b', 'c'] ['a', 'b c'] True True y)~");
  EXPECT_EQ(render(R"~({{ 'Hello World'.replace('o', '0') }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('b') }} {{ '{} and {}'.format(1, 'x') }} {{ 'AbC'.upper() }}{{ 'AbC'.lower() }})~",
                   R"~({})~"),
            R"~(Hell0 W0rld Hello World Hello 2 2 1 and x ABCabc)~");
  EXPECT_EQ(render(R"~({{ 'abc'[0] }}{{ 'abc'[-1] }}{{ 'héllo'[1:3] }}{{ [1,2,3,4][::-1] }}{{ [1,2,3,4][1:] }}{{ [1,2,3,4][:-1] }}{{ [1,2,3,4,5][::2] }}{{ 'abc'[::-1] }}{{ [1,2,3][5:] }})~",
                   R"~({})~"),
            R"~(acél[4, 3, 2, 1][2, 3, 4][1, 2, 3][1, 3, 5]cba[])~");
  EXPECT_EQ(render(R"~({{ messages[0]['content'] | trim }}{{ messages[0].content | trim + '!' }}{{ messages | length - 1 }}{{ messages[-1].role }})~",
                   R"~({"messages": [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "x"}]})~"),
            R"~(hihi!1assistant)~");
  EXPECT_EQ(render(R"~({{ 1 in [1, 2] }} {{ 'a' in 'cat' }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} {{ 2 >= 3 }} {{ 'x' != 'y' }})~",
                   R"~({})~"),
            R"~(True True True True True True True True True False True)~");
}

TEST(Jinja, FiltersAndTests) {
  EXPECT_EQ(render(R"~({{ xs | length }} {{ 'héllo' | length }} {{ xs | join(', ') }} {{ xs | first }} {{ xs | last }} {{ xs | reverse | list }} {{ xs | sort }} {{ xs | sum }} {{ xs | min }} {{ xs | max }} {{ xs | unique | list }} {{ xs | count }})~",
                   R"~({"xs": [3, 1, 2, 3]})~"),
            R"~(4 5 3, 1, 2, 3 3 3 [3, 2, 1, 3] [1, 2, 3, 3] 9 1 3 [3, 1, 2] 4)~");
  EXPECT_EQ(render(R"~({{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | join('|') }} {{ ms | rejectattr('role', '==', 'user') | list | length }} {{ ms | map(attribute='role') | list }} {{ ['a', 'B'] | map('upper') | list }} {{ [0, 1, 2, ''] | select | list }} {{ [1,2,3,4] | reject('odd') | list }} {{ ms|selectattr('c')|list|length }})~",
                   R"~({"ms": [{"role": "user", "c": "u1"}, {"role": "assistant", "c": ""}, {"role": "user", "c": "u2"}]})~"),
            R"~(u1|u2 1 ['user', 'assistant', 'user'] ['A', 'B'] [1, 2] [2, 4] 2)~");
  EXPECT_EQ(render(R"~({{ u | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('x', true) }} {{ u | length }} {{ u is iterable }} {{ u | list }})~",
                   R"~({})~"),
            R"~(d  d x 0 True [])~");
  EXPECT_EQ(render(R"~({{ x is string }}{{ x is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ {} is mapping }}{{ [] is sequence }}{{ true is boolean }}{{ false is false }}{{ true is true }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ none is none }}{{ x is not none }}{{ u is undefined }}{{ x is defined }})~",
                   R"~({"x": "s"})~"),
            R"~(TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrue)~");
  EXPECT_EQ(render(R"~({{ 3.7 | int }} {{ '42' | int }} {{ 'x' | int }} {{ '3.5' | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5|round }} {{ 2.1 | round(0, 'ceil') }} {{ -3 | abs }} {{ 1 | string }} {{ [1] | string }})~",
                   R"~({})~"),
            R"~(3 42 0 3.5 2.57 2.0 4.0 3.0 3 1 [1])~");
  EXPECT_EQ(render(R"~({{ d | items | list }} {{ d | dictsort }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d['a'] }} {{ d.a }})~",
                   R"~({"d": {"b": 2, "a": 1}})~"),
            R"~([('b', 2), ('a', 1)] [('a', 1), ('b', 2)] ['b', 'a'] [2, 1] 1 def None 1 1)~");
  EXPECT_EQ(render(R"~({{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'x y' | upper }}{{ 'X' | lower }}{{ 'hello wOrld' | title }}{{ 'hi there' | capitalize }}{{ 'aXa' | replace('a', 'b') }}{{ '<&>"' | e }}{{ '<' | safe }})~",
                   R"~({})~"),
            R"~(a
  b

  c|  a
  b|X YxHello WorldHi therebXb&lt;&amp;&gt;&#34;<)~");
  EXPECT_EQ(render(R"~({{ dict(a=1, b=2) }} {{ namespace(x=1).x }} {{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }})~",
                   R"~({})~"),
            R"~({'a': 1, 'b': 2} 1 [0, 1, 2] [1, 4, 7] [5, 3, 1])~");
}

TEST(Jinja, TojsonAsTransformers) {
  EXPECT_EQ(render(R"~({{ x | tojson }}
{{ x | tojson(indent=2) }}
{{ x | tojson(sort_keys=true) }}
{{ x|tojson(separators=(',', ':')) }}
{{ 'é"\n\t\x01/' | tojson }}
{{ 'é😀' | tojson(ensure_ascii=true) }}
{{ 1.0 | tojson }} {{ none | tojson }} {{ [] | tojson(indent=4) }})~",
                   R"~({"x": {"b": [1, 2.5, null, true, "ü🎉"], "a": {}, "c": [], "d": {"e": 1}}})~"),
            R"~({"b": [1, 2.5, null, true, "ü🎉"], "a": {}, "c": [], "d": {"e": 1}}
{
  "b": [
    1,
    2.5,
    null,
    true,
    "ü🎉"
  ],
  "a": {},
  "c": [],
  "d": {
    "e": 1
  }
}
{"a": {}, "b": [1, 2.5, null, true, "ü🎉"], "c": [], "d": {"e": 1}}
{"b":[1,2.5,null,true,"ü🎉"],"a":{},"c":[],"d":{"e":1}}
"é\"\n\t\u0001/"
"\u00e9\ud83d\ude00"
1.0 null [])~");
}

TEST(Jinja, IteratorsRangesAndDictViewsAsPython) {
  EXPECT_EQ(render(R"~({{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ (d.items())|length }}|{{ range(3) }}|{{ range(3)|length }}|{{ range(3)[1] }}|{{ range(1, 10, 3) }}|{{ range(10)[2:8:2] }}|{{ range(5)[::-1] }}|{{ range(0) }})~",
                   R"~({"d": {"a": 1, "b": [2]}})~"),
            R"~(dict_items([('a', 1), ('b', [2])])|dict_keys(['a', 'b'])|dict_values([1, [2]])|2|range(0, 3)|3|1|range(1, 10, 3)|range(2, 8, 2)|range(4, -1, -1)|range(0, 0))~");
  EXPECT_EQ(render(R"~({{ [1,2]|map('string')|first }}|{% set g = [1,2,3]|select %}{{ g|first }}{{ g|list }}{{ g|list }}|{% if [0]|select %}T{% endif %}|{{ 1 in u }}|{{ d.keys() == d.keys() }}|{{ [1]|select == [1] }}|{{ (1, 2) == [1, 2] }}|{{ u ~ 1 }})~",
                   R"~({"d": {"a": 1}})~"),
            R"~(1|1[2, 3][]|T|False|True|False|False|1)~");
  EXPECT_EQ(render(R"~({% set g = [1,2,3]|map('string') %}{{ '2' in g }}{{ g|list }}|{{ [1,2] is sequence }}{{ d.items() is sequence }}{{ (d|items) is iterable }}{{ range(2) is sequence }}|{{ d.items()|list }}|{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}|{{ [3,1]|reverse|list }}|{{ [1,1,2]|unique|list }})~",
                   R"~({"d": {"a": 1, "b": 2}})~"),
            R"~(True['3']|TrueFalseTrueTrue|[('a', 1), ('b', 2)]|a1b2|[1, 3]|[1, 2])~");
  EXPECT_EQ(render(R"~({{ x.y }}|{{ none.x }}|{{ none[0] }}|{{ 'abc'.x }}|{{ loop }}|{{ [1,2][5] }}|{{ (1,)[5] is defined }}|{{ '%s-%d' % ('a', 3) }}|{{ '%r' % 'x' }}|{{ '%d%%' % 5 }}|{{ true + 1 }}|{{ 1.5 // 1 }}|{{ 7.5 % 2 }}|{{ 2 ** 0.5 }})~",
                   R"~({"x": null})~"),
            R"~(||||||False|a-3|'x'|5%|2|1.0|1.5|1.4142135623730951)~");
}

TEST(Jinja, GenerationSpansAreBytesOfTheTopLevelOutput) {
  // As transformers' AssistantTracker: each block's span starts at the output written so far.
  auto r = render_full("é{% generation %}abc{% endgeneration %}x{% for i in range(2) %}"
                       "{% generation %}g{{ i }}ü{% endgeneration %}{% endfor %}",
                       "{}");
  EXPECT_EQ(r.text, "éabcxg0üg1ü");
  ASSERT_EQ(r.generation.size(), 3u);
  EXPECT_EQ(r.generation[0], (std::pair<size_t, size_t>{2, 5}));
  EXPECT_EQ(r.generation[1], (std::pair<size_t, size_t>{6, 10}));
  EXPECT_EQ(r.generation[2], (std::pair<size_t, size_t>{10, 14}));
  ChatTemplate marked("{% generation %}x{% endgeneration %}", "m");
  ChatTemplate plain("{{ 'generation' }}", "p");
  EXPECT_TRUE(marked.has_generation_markers());
  EXPECT_FALSE(plain.has_generation_markers());
}

TEST(Jinja, TransformersVariables) {
  // tools and documents are None unless given; add_generation_prompt is a bool; special tokens
  // are variables; kwargs override them.
  ChatTemplate t("{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ bos_token }}|"
                 "{{ eos_token }}|{{ tools | length if tools else 0 }}",
                 "vars", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_EQ(t.render(R"({"messages": [{"role": "user", "content": "x"}]})", true).text,
            "True|True|True|<s>|</s>|0");
  EXPECT_EQ(t.render(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"a": 1}]})", false).text,
            "False|True|False|<s>|</s>|1");
  t.set_template_kwargs(R"({"eos_token": "<|eot|>"})");
  EXPECT_EQ(t.render(R"({"messages": [{"role": "user", "content": "x"}]})", false).text,
            "True|True|False|<s>|<|eot|>|0");
  // Messages: None-valued keys are dropped, reasoning is aliased as transformers does.
  ChatTemplate m("{% for m in messages %}{{ m | tojson }};{% endfor %}", "msgs");
  EXPECT_EQ(m.render(R"({"messages": [{"role": "assistant", "content": "a", "tool_calls": null, "reasoning": "r"}]})",
                     false).text,
            R"({"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "r"};)");
}

TEST(Jinja, ErrorsNameTheTemplateLineAndColumn) {
  EXPECT_EQ(error_of("{{ x.y }}"), "chat template test.jinja line 1, column 5: 'x' is undefined");
  EXPECT_EQ(error_of("{{ m.a.b }}", R"({"m": {}})"),
            "chat template test.jinja line 1, column 7: 'dict object' has no attribute 'a'");
  EXPECT_EQ(error_of("line one\n  {{ raise_exception('Only user and assistant roles!') }}"),
            "chat template test.jinja line 2, column 21: the template raised an error: Only user and "
            "assistant roles!");
  EXPECT_EQ(error_of("{% if %}"), "chat template test.jinja line 1, column 7: expected an expression, found the end of the tag");
  EXPECT_EQ(error_of("ok\n{{ 1 + }}"), "chat template test.jinja line 2, column 8: expected an expression, found \"}}\"");
  EXPECT_EQ(error_of("{{ a | nofilter }}"),
            "chat template test.jinja line 1, column 8: No filter named 'nofilter' found. (docs/data.md lists the supported filters)");
  EXPECT_EQ(error_of("x\n\n  {{ 'a' + 1 }}"),
            "chat template test.jinja line 3, column 10: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{% for x in 1 %}{% endfor %}"), "chat template test.jinja line 1, column 13: 'int' object is not iterable");
  EXPECT_EQ(error_of("{% if true %}"),
            "chat template test.jinja line 1, column 14: unexpected end of the template, expected {% elif %} or "
            "{% else %} or {% endif %}");
  EXPECT_EQ(error_of("{{ [].append(1) }}"),
            "chat template test.jinja line 1, column 13: access to attribute 'append' of 'list' object is unsafe. "
            "(Templates cannot modify their inputs.) (it was called)");
  EXPECT_EQ(error_of("{% set x.y = 1 %}", R"({"x": 1})"),
            "chat template test.jinja line 1, column 4: cannot assign attribute \"y\" on \"x\", which is not a "
            "namespace() object");
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"),
            "chat template test.jinja line 1, column 4: the {% include %} tag is not supported by LoongForge's "
            "Jinja subset (docs/data.md lists it)");
  EXPECT_EQ(error_of("{{ 'abc }}"), "chat template test.jinja line 1, column 4: the string literal is not closed");
  EXPECT_EQ(error_of("{{ x | tojson }}"), "chat template test.jinja line 1, column 8: tojson: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"),
            "chat template test.jinja line 1, column 35: macro 'f' takes not more than 1 argument(s), got 2");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "chat template test.jinja line 1, column 6: integer division or modulo by zero");
  // Python raises on these too: generators have no len(), ranges and views are not JSON.
  EXPECT_EQ(error_of("{{ [1] | select | length }}"),
            "chat template test.jinja line 1, column 19: object of type 'generator' has no len()");
  EXPECT_EQ(error_of("{{ range(3) | tojson }}"),
            "chat template test.jinja line 1, column 15: tojson: Object of type range is not JSON serializable");
  // A stray non-ASCII character is named whole; hostile nesting is refused, not a stack overflow.
  EXPECT_EQ(error_of("{{ a é }}"), "chat template test.jinja line 1, column 6: unexpected character 'é' in a tag");
  EXPECT_EQ(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "chat template test.jinja line 1, column 104: expressions or blocks nested deeper than 200 levels");
  // Outside the subset: clear errors rather than different output.
  EXPECT_EQ(error_of("{{ 10 ** 20 }}"),
            "chat template test.jinja line 1, column 7: integer overflow in 10 ** 20 (integers are 64-bit here)");
  EXPECT_EQ(error_of("{{ '%5d' % 3 }}"),
            "chat template test.jinja line 1, column 10: the %5 format (or flags and widths) is not supported; use "
            "%s, %r, %d, %i, %f");
}

}  // namespace
TEST(Jinja, FilterBlocksAndMarkup) {
  EXPECT_EQ(render(R"~({% filter upper %}a{{ 'b' }}{% set z = 1 %}{% endfilter %}[{{ z }}])~"),
            "AB[]");
  EXPECT_EQ(render(R"~({% filter trim | replace('a', 'o') %}  banana  {% endfilter %}|{% filter indent(2, true) %}x
y{% endfilter %})~"),
            "bonono|  x\n  y");
  EXPECT_EQ(render(R"~({% set t | upper | trim %} hi {{ n }} {% endset %}[{{ t }}]{% set u %}{% set inner = 2 %}u{% endset %}{{ inner is defined }})~", R"~({"n": 3})~"),
            "[HI 3]False");
  EXPECT_EQ(render(R"~({{ '<b>' | safe + x }}|{{ x + '<i>' | safe }}|{{ x ~ '<i>' | safe }}|{{ '<b>' | safe + '&' | safe }}|{{ x | e }}|{{ x | e | e }}|{{ (x | e) is string }})~", R"~({"x": "a'\"&<>"})~"),
            "<b>a&#39;&#34;&amp;&lt;&gt;|a&#39;&#34;&amp;&lt;&gt;<i>|a'\"&<><i>|<b>&|a&#39;&#34;&amp;&lt;&gt;|a&#39;&#34;&amp;&lt;&gt;|True");
  EXPECT_EQ(render(R"~({{ ('%s=%d' | safe) % (x, 5) }}|{{ ('<%s>' | safe) % x }}|{{ ('ab' | safe) * 2 + x }}|{{ ('x<' | safe)[1] + x }}|{{ ('a<b' | safe)[:2] + x }})~", R"~({"x": "'"})~"),
            "&#39;=5|<&#39;>|abab&#39;|<&#39;|a<&#39;");
  EXPECT_EQ(render(R"~({{ ('|' | safe).join([x, '<']) }}|{{ ('{} {}' | safe).format(x, 1) }}|{{ (' A ' | safe).strip() + x }}|{{ ('a' | safe).upper() + x }}|{{ ('a,b' | safe).split(',')[0] + x }}|{{ ('a&' | safe).replace('&', x) }})~", R"~({"x": "<&>"})~"),
            "&lt;&amp;&gt;|&lt;|&lt;&amp;&gt; 1|A&lt;&amp;&gt;|A&lt;&amp;&gt;|a&lt;&amp;&gt;|a&lt;&amp;&gt;");
  EXPECT_EQ(render(R"~({{ ('a' | safe | trim) + x }}|{{ ('a' | safe | string) + x }}|{{ ('a' | safe | upper) + x }}|{{ ('a' | safe | replace('a', 'b')) + x }}|{{ (['a'] | join) + x }}|{{ (('a' | safe) | reverse) + x }})~", R"~({"x": "<"})~"),
            "a&lt;|a&lt;|A&lt;|b<|a<|a&lt;");
  EXPECT_EQ(render(R"~({{ none | select | list }}{{ none | selectattr('a') | list }}{{ none | map('upper') | list }}{{ 0 | rejectattr('x') | list }}{{ '' | map(attribute='x') | list }})~"),
            "[][][][][]");
  EXPECT_NE(error_of(R"~({{ 'a' + {} }})~").find("can only concatenate str (not \"dict\") to str"), std::string::npos);
  EXPECT_NE(error_of(R"~({{ [1] + 'a' }})~").find("can only concatenate list (not \"str\") to list"), std::string::npos);
  EXPECT_NE(error_of(R"~({{ (1,) + [2] }})~").find("can only concatenate tuple (not \"list\") to tuple"), std::string::npos);
  EXPECT_NE(error_of(R"~({{ 1 + 'a' }})~").find("unsupported operand type(s) for +: 'int' and 'str'"), std::string::npos);
  EXPECT_NE(error_of(R"~({{ ('a' | safe) + 1 }})~").find("unsupported operand type(s) for +: 'Markup' and 'int'"), std::string::npos);
  EXPECT_NE(error_of(R"~({{ none + 'a' }})~").find("unsupported operand type(s) for +: 'NoneType' and 'str'"), std::string::npos);
  EXPECT_EQ(render(R"~({% for i in [1,2,3] %}{% filter upper %}a{{ i }}{% if i == 2 %}{% continue %}{% endif %}b{% endfilter %}{% endfor %}|{% for i in [1,2,3] %}{% filter upper %}a{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endfilter %}{% endfor %}|{% for i in [1,2] %}{% set s %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endset %}{{ s }}{% endfor %})~"),
            "A1BA3B|A1|1");
  EXPECT_EQ(render(R"~({{ ['a' | safe] }}|{{ '%r' % ('a' | safe) }}|{{ ('%r' | safe) % ('a' | safe) }}|{{ (',' | safe).join([1, none, '<']) }}|{{ ('a' | safe).replace('a', 1) }})~"),
            "[Markup('a')]|Markup('a')|Markup(&#39;a&#39;)|1,None,&lt;|1");
  EXPECT_NE(error_of(R"~({% filter upper is string %}x{% endfilter %})~").find("expected the end of the"), std::string::npos);
  EXPECT_NE(error_of(R"~({% set x | upper is string %}x{% endset %})~").find("expected the end of the"), std::string::npos);
}
