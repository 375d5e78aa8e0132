#!/usr/bin/env python3
"""Test oracle (Python only in tests): chat templates through transformers' apply_chat_template,
for test_chat_template.cpp to compare `loongforge-data render-chat` against.

    chat_template_oracle.py OUT_DIR

Trains a small byte-level BPE tokenizer.json (Qwen-style: NFC, Split regex, ByteLevel) whose added
tokens are the templates' special tokens, and writes one HF tokenizer directory per template
variant, loadable with transformers.AutoTokenizer:
  qwen25/         Qwen2.5-Instruct's template (tests/data/chat_templates), as chat_template.jinja
  qwen25_marked/  the same with {% generation %} around each assistant turn's content and end
                  token, in tokenizer_config.json "chat_template" (a string)
  qwen3/          Qwen3's template in tokenizer_config.json
  qwen3_marked/   marked Qwen3 in tokenizer_config.json as a list: "default" (marked) and "plain"
  llama3/         Llama-3.1/3.3-Instruct's template (bos as an AddedToken dict)
  llama3_marked/  marked Llama 3, as chat_template.jinja
  gemma2/         Gemma 2's template over a Gemma-style SentencePiece BPE (Replace " " -> "▁",
                  byte fallback, <start_of_turn> / <end_of_turn> special tokens)
  gemma2_marked/  the same with {% generation %} around each model turn's content and end token
  phi35/          Phi-3.5-mini-instruct's template (eos_token after the last message without a
                  generation prompt) over the same BPE with its turn markers added
  phi35_marked/   the same with {% generation %} around each assistant turn's content and <|end|>
Marked variants render exactly the text of the original (checked here).

Also writes conversations_{qwen,llama,gemma,phi}.jsonl and expected.json: a list of runs
  {"variant", "conversations", "add_generation_prompt", "kwargs", "input_ids": [[...]],
   "masks": [[...]] (transformers' assistant_masks), "rule_masks": [[...]] (unmarked variants: the
   rendering rule of docs/data.md, re-implemented here)}
and rendered.json: the text (or the error message) transformers renders with every template in
tests/data/chat_templates (shipped templates of some 70 models), for every conversation here,
with add_generation_prompt both ways:
  [{"template": file name, "conversation": {...}, "add_generation_prompt": bool,
    "special_tokens": {...}, "kwargs": {...}, "text": str or null, "error": str or null}].
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
QWEN_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def read(name):
    with open(os.path.join(HERE, "chat_templates", name), encoding="utf-8") as f:
        return f.read()


def replace_once(text, old, new):
    assert text.count(old) == 1, (old, text.count(old))
    return text.replace(old, new)


def mark_qwen25(t):
    t = replace_once(t, """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}""", """    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {{- message.content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' }}""")
    return replace_once(t, """        {%- endfor %}
        {{- '<|im_end|>\\n' }}""", """        {%- endfor %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}""")


def mark_qwen3(t):
    t = replace_once(t, """        {%- if loop.index0 > ns.last_query_index %}""", """        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- generation %}
        {%- if loop.index0 > ns.last_query_index %}""")
    t = replace_once(t, """'<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content""",
                     """'<think>\\n' + reasoning_content""")
    t = t.replace("""{{- '<|im_start|>' + message.role + '\\n' + content }}""", """{{- content }}""")
    return replace_once(t, """        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}""", """        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "tool" %}""")


def mark_llama3(t):
    t = replace_once(t, """    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}""",
                     """    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) and message.role == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}
        {{- message['content'] | trim + '<|eot_id|>' }}
        {%- endgeneration %}
    {%- elif not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}""")
    t = replace_once(t, """        {%- set tool_call = message.tool_calls[0].function %}""", """        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}""")
    t = t.replace("""            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n""", "")
    return replace_once(t, """            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""", """            {{- "<|eot_id|>" }}
        {%- endif %}
        {%- endgeneration %}
    {%- elif message.role == "tool" or message.role == "ipython" %}""")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city (°C).",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 北京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}


def call(name, args, as_string=False):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


QWEN_CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "You are a careful assistant."},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "2+2 = 4."}]},
    {"messages": [{"role": "user", "content": "你好！请介绍一下北京。"},
                  {"role": "assistant", "content": "北京是中国的首都 🏯，历史悠久。"},
                  {"role": "user", "content": "Et Zürich? Café, naïve, résumé… 😀👍🏽"},
                  {"role": "assistant", "content": "Zürich liegt in der Schweiz 🇨🇭.\nÇa va très bien."},
                  {"role": "user", "content": "Danke"},
                  {"role": "assistant", "content": "  Gern geschehen!  \n"}]},
    {"messages": [{"role": "system", "content": "Use tools when helpful."},
                  {"role": "user", "content": "Weather in Paris and 3*7?"},
                  {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"}),
                                                                       call("calculate", {"expr": "3*7"})]},
                  {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18, \"sky\": \"☁️\"}"},
                  {"role": "tool", "name": "calculate", "content": "21"},
                  {"role": "assistant", "content": "Paris: 18 °C, cloudy ☁️. And 3*7 = 21."}],
     "tools": [WEATHER_TOOL, CALC_TOOL]},
    {"messages": [{"role": "user", "content": "東京の天気は？"},
                  {"role": "assistant", "content": "Let me check.", "tool_calls": [call("get_weather", {"city": "東京"}, as_string=True)]},
                  {"role": "tool", "content": "晴れ, 25°C"},
                  {"role": "assistant", "content": "東京は晴れ、25°Cです。"}],
     "tools": [WEATHER_TOOL]},
    {"messages": [{"role": "user", "content": "Think: is 91 prime?"},
                  {"role": "assistant", "reasoning_content": "91 = 7 * 13, so not prime.", "content": "No, 91 = 7 × 13."},
                  {"role": "user", "content": "And 97?"},
                  {"role": "assistant", "content": "<think>\nCheck divisors up to 9: none divide 97.\n</think>\n\nYes, 97 is prime."}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Say e\u0301 and A\u030a (combining marks)."},
                  {"role": "assistant", "content": "e\u0301 A\u030a — done.", "tool_calls": None},
                  {"role": "user", "content": "Now a question left open?"}]},
]

EXTRA_CONVERSATIONS = [
    # Mistral's tool-call ids are 9 characters; DeepSeek's template reads content None as absent.
    {"messages": [{"role": "user", "content": "Weather in Köln?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [dict(call("get_weather", {"city": "Köln"}, as_string=True), id="call00001")]},
                  {"role": "tool", "content": "{\"temp\": 9}", "tool_call_id": "call00001"},
                  {"role": "assistant", "content": "<think>9 is cold</think>It is 9 °C."}],
     "tools": [WEATHER_TOOL]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "},
                  {"role": "user", "content": "c ✓"}]},
]

# Content as a list of parts (the VLM message format), for rendered.json only.
PARTS_CONVERSATIONS = [
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "You describe pictures."}]},
                  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in it?"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A cat 🐈 on a mat."}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Two parts: "}, {"type": "text", "text": "a & <b>"}]},
                  {"role": "assistant", "content": "Quotes \"x\" and 'y' & <z>."}]},
]

# Gemma 2's template: user / assistant turns alternating from the user, no system or tool roles.
GEMMA_CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "  2+2 = 4.\n"}]},
    {"messages": [{"role": "user", "content": "你好！请介绍一下北京。"},
                  {"role": "assistant", "content": "北京是中国的首都 🏯，历史悠久。"},
                  {"role": "user", "content": "Et Zürich?  Café, naïve, résumé… 😀👍🏽"},
                  {"role": "assistant", "content": "Zürich liegt in der Schweiz 🇨🇭.\nÇa  va très bien ꙮ."}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": " b "},
                  {"role": "user", "content": "c ✓ and a question left open?"}]},
]

# Phi-3.5's template: system, user and assistant roles, content strings.
PHI_CONVERSATIONS = QWEN_CONVERSATIONS[:2] + GEMMA_CONVERSATIONS

LLAMA_CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "  You are a helpful assistant.  "},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "  2+2 = 4.\n"}]},
    {"messages": [{"role": "user", "content": "你好！"},
                  {"role": "assistant", "content": "你好 😀 Ça va?"},
                  {"role": "user", "content": "Très bien, merci — naïve café."},
                  {"role": "assistant", "content": "Schön zu hören! 👍🏽"}]},
    {"messages": [{"role": "system", "content": "Use the tools."},
                  {"role": "user", "content": "Weather in Zürich?"},
                  {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Zürich", "unit": "celsius"})]},
                  {"role": "tool", "content": "{\"temp\": 12, \"sky\": \"🌧\"}"},
                  {"role": "assistant", "content": "12 °C and rainy 🌧."},
                  {"role": "user", "content": "Thanks!"}],
     "tools": [WEATHER_TOOL]},
]


def train_tokenizer(out_dir):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = []
    for name in os.listdir(os.path.join(HERE, "chat_templates")):
        corpus.append(read(name))
    for c in QWEN_CONVERSATIONS + LLAMA_CONVERSATIONS + GEMMA_CONVERSATIONS:
        corpus.append(json.dumps(c, ensure_ascii=False))
        for m in c["messages"]:
            corpus.append(str(m.get("content") or ""))
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 3, trainer)
    tok.add_tokens(ADDED)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return path


def train_gemma_tokenizer(out_dir):
    """Gemma-style SentencePiece BPE: Replace(" ", "▁"), Split(" ", MergedWithPrevious), byte
    fallback (the 256 <0xXX> tokens in the vocabulary), unk, a small alphabet so that rarer
    characters fall back to bytes; the turn markers are special added tokens."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    corpus = [read(name) for name in os.listdir(os.path.join(HERE, "chat_templates"))]
    for c in GEMMA_CONVERSATIONS + LLAMA_CONVERSATIONS:
        corpus += [str(m.get("content") or "") for m in c["messages"]]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>",
                                                                  "<start_of_turn>", "<end_of_turn>"],
                                  limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(corpus * 3, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return path


def mark_phi35(t):
    return replace_once(t, """{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}""",
                        """{{'<|assistant|>\n'}}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{ '\n' }}""")


def mark_gemma2(t):
    return replace_once(t, r"""{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}""",
                        r"""{% if role == 'model' %}{{ '<start_of_turn>model\n' }}{% generation %}"""
                        r"""{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{{ '\n' }}"""
                        r"""{% else %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endif %}""")


def write_variant(out, name, tokenizer_json, config, jinja=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(tokenizer_json, encoding="utf-8") as f:
        data = f.read()
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(data)
    config = dict(config, tokenizer_class="PreTrainedTokenizerFast")
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    if jinja is not None:
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(jinja)
    return d


def rule_masks(tok, conv, add_generation_prompt, kwargs):
    """docs/data.md's masks for templates without generation markers, re-implemented."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in conv["messages"]]
    tools = conv.get("tools")

    def render(msgs, agp):
        return tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp, **kwargs)

    full = render(messages, add_generation_prompt)
    spans = []
    added = {i: t.content for i, t in tok.added_tokens_decoder.items()}
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prompt = render(messages[:i], True)
        if full.startswith(prompt):
            start = len(prompt)
        else:
            history = render(messages[:i], False)
            assert full.startswith(history)
            start = 0
            while start < min(len(prompt), len(full)) and prompt[start] == full[start]:
                start += 1
            start = max(start, len(history))
        upto = render(messages[:i + 1], False)
        tail = upto[start:]
        enc_tail = tok(tail, add_special_tokens=False, return_offsets_mapping=True)
        ids, offs = enc_tail["input_ids"], enc_tail["offset_mapping"]
        ends = [k for k, t in enumerate(ids) if t in added]
        end_token = added[ids[ends[-1]]] if ends else None
        if end_token is not None:
            # A template's text appended only where the conversation ends without a generation
            # prompt (Phi-3.5's eos): the renders with and without the prompt part differ after an
            # added token and whitespace, and the rest is added tokens and whitespace only.
            try:
                prompted = render(messages[:i + 1], True)
            except Exception:  # a template that cannot prompt after this turn: no exception
                prompted = upto
            common = 0
            while common < min(len(upto), len(prompted)) and upto[common] == prompted[common]:
                common += 1
            for b, e in offs:
                if start + b < common < start + e:
                    common = start + b
            last = ends[-1]
            if start + offs[last][1] > common and all(
                    ids[k] in added or not tail[offs[k][0]:offs[k][1]].strip(" \n\t\r")
                    for k in range(len(ids)) if start + offs[k][0] >= common):
                earlier = [k for k in ends if start + offs[k][1] <= common]
                if earlier and not upto[start + offs[earlier[-1]][1]:common].strip(" \n\t\r"):
                    end_token = added[ids[earlier[-1]]]
            end = full.index(end_token, start) + len(end_token)
        else:
            assert full.startswith(upto) and len(upto) > start
            end = len(upto)
        spans.append((start, end))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [0] * len(enc["input_ids"])
    for t, (b, e) in enumerate(enc["offset_mapping"]):
        if any(e > s and b < f for s, f in spans):
            mask[t] = 1
    return enc["input_ids"], mask


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tokenizer_json = train_tokenizer(os.path.join(out, "base"))
    q25, q3, ll = (read("Qwen-Qwen2.5-7B-Instruct.jinja"), read("Qwen-Qwen3-0.6B.jinja"),
                   read("meta-llama-Llama-3.3-70B-Instruct.jinja"))
    qwen_cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    llama_cfg = {"bos_token": {"content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                               "rstrip": False, "single_word": False, "special": True, "__type": "AddedToken"},
                 "eos_token": "<|eot_id|>"}
    write_variant(out, "qwen25", tokenizer_json, qwen_cfg, jinja=q25)
    write_variant(out, "qwen25_marked", tokenizer_json, dict(qwen_cfg, chat_template=mark_qwen25(q25)))
    write_variant(out, "qwen3", tokenizer_json, dict(qwen_cfg, chat_template=q3))
    write_variant(out, "qwen3_marked", tokenizer_json,
                  dict(qwen_cfg, chat_template=[{"name": "default", "template": mark_qwen3(q3)},
                                                {"name": "plain", "template": q3}]))
    write_variant(out, "llama3", tokenizer_json, dict(llama_cfg, chat_template=ll))
    write_variant(out, "llama3_marked", tokenizer_json, llama_cfg, jinja=mark_llama3(ll))
    gemma_json = train_gemma_tokenizer(os.path.join(out, "gemma_base"))
    g2 = read("google-gemma-2-2b-it.jinja")
    gemma_cfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    write_variant(out, "gemma2", gemma_json, dict(gemma_cfg, chat_template=g2))
    write_variant(out, "gemma2_marked", gemma_json, dict(gemma_cfg, chat_template=mark_gemma2(g2)))

    # Phi-3.5: the template prints eos_token after the last message when there is no generation
    # prompt; its turn markers are added special tokens.
    phi = Tokenizer.from_file(tokenizer_json)
    phi.add_special_tokens(["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"])
    phi_json = os.path.join(out, "phi_base", "tokenizer.json")
    os.makedirs(os.path.dirname(phi_json), exist_ok=True)
    phi.save(phi_json)
    p35 = read("microsoft-Phi-3.5-mini-instruct.jinja")
    phi_cfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    write_variant(out, "phi35", phi_json, dict(phi_cfg, chat_template=p35))
    write_variant(out, "phi35_marked", phi_json, dict(phi_cfg, chat_template=mark_phi35(p35)))

    for name, convs in (("qwen", QWEN_CONVERSATIONS), ("llama", LLAMA_CONVERSATIONS), ("gemma", GEMMA_CONVERSATIONS),
                        ("phi", PHI_CONVERSATIONS)):
        with open(os.path.join(out, f"conversations_{name}.jsonl"), "w", encoding="utf-8") as f:
            for c in convs:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")

    from transformers import AutoTokenizer
    runs = []
    plan = [("qwen25", "qwen", [{}]), ("qwen3", "qwen", [{}, {"enable_thinking": False}]),
            ("llama3", "llama", [{}, {"date_string": "01 Jan 2025"}]), ("gemma2", "gemma", [{}]),
            ("phi35", "phi", [{}])]
    for family, conv_name, kwarg_sets in plan:
        convs = {"qwen": QWEN_CONVERSATIONS, "llama": LLAMA_CONVERSATIONS, "gemma": GEMMA_CONVERSATIONS,
                 "phi": PHI_CONVERSATIONS}[conv_name]
        plain = AutoTokenizer.from_pretrained(os.path.join(out, family))
        marked = AutoTokenizer.from_pretrained(os.path.join(out, family + "_marked"))
        for kwargs in kwarg_sets:
            for agp in (False, True):
                base = {"conversations": f"conversations_{conv_name}.jsonl", "add_generation_prompt": agp, "kwargs": kwargs}
                runs_plain = dict(base, variant=family, input_ids=[], masks=[], rule_masks=[])
                runs_marked = dict(base, variant=family + "_marked", input_ids=[], masks=[])
                for c in convs:
                    args = dict(tools=c.get("tools"), add_generation_prompt=agp, return_dict=True,
                                return_assistant_tokens_mask=True, **kwargs)
                    p = plain.apply_chat_template(c["messages"], **args)
                    m = marked.apply_chat_template(c["messages"], **args)
                    tp = plain.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                                   add_generation_prompt=agp, **kwargs)
                    tm = marked.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                                    add_generation_prompt=agp, **kwargs)
                    assert tp == tm, (family, tp, tm)
                    assert list(p["input_ids"]) == list(m["input_ids"])
                    assert sum(m["assistant_masks"]) > 0, (family, c)
                    ids, rule = rule_masks(plain, c, agp, kwargs)
                    assert ids == list(p["input_ids"])
                    runs_plain["input_ids"].append(list(p["input_ids"]))
                    runs_plain["masks"].append(list(p["assistant_masks"]))
                    runs_plain["rule_masks"].append(rule)
                    runs_marked["input_ids"].append(list(m["input_ids"]))
                    runs_marked["masks"].append(list(m["assistant_masks"]))
                runs += [runs_plain, runs_marked]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(runs, f)

    rendered = []
    renderer = AutoTokenizer.from_pretrained(os.path.join(out, "qwen25"))
    # {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, and a BOS for the templates that print one
    special = dict(renderer.special_tokens_map, bos_token="<s>")
    # Every conversation with add_generation_prompt both ways; the first three and the parts also
    # with template kwargs that thinking, reasoning and tool-using templates read.
    kwargs_set = {"enable_thinking": False, "thinking": True, "reasoning_effort": "low",
                  "builtin_tools": ["code_interpreter"], "custom_instructions": "Answer in English."}
    convs = QWEN_CONVERSATIONS + LLAMA_CONVERSATIONS + EXTRA_CONVERSATIONS + PARTS_CONVERSATIONS
    runs = [(c, agp, {}) for c in convs for agp in (False, True)]
    runs += [(c, True, kwargs_set) for c in QWEN_CONVERSATIONS[:3] + PARTS_CONVERSATIONS]
    for name in sorted(n for n in os.listdir(os.path.join(HERE, "chat_templates")) if n.endswith(".jinja")):
        for c, agp, kwargs in runs:
            rec = {"template": name, "conversation": c, "add_generation_prompt": agp,
                   "special_tokens": special, "kwargs": kwargs, "text": None, "error": None}
            try:
                rec["text"] = renderer.apply_chat_template(c["messages"], tools=c.get("tools"), chat_template=read(name),
                                                        tokenize=False, add_generation_prompt=agp,
                                                        **special, **kwargs)
            except Exception as e:  # the template's raise_exception, or a jinja2 error
                rec["error"] = str(e)
            rendered.append(rec)
    with open(os.path.join(out, "rendered.json"), "w", encoding="utf-8") as f:
        json.dump(rendered, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
