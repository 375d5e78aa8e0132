#!/usr/bin/env python3
"""Test oracle (Python only in tests): trains byte-level BPE tokenizer.json files with the HF
`tokenizers` package and records what HF encodes, for test_tokenizer.cpp to compare against.

    hf_tokenizer_oracle.py OUT_DIR [--target-bytes N] [--corpus-only]

--corpus-only writes the tokenizers and docs.jsonl but no expectations (for benchmarks:
docs/data.md makes its 50 MB corpus this way).

Writes into OUT_DIR:
  docs.jsonl                  {"text": ...} varied documents (CJK, emoji, digits, whitespace runs,
                              code, special tokens, combining marks), >= target bytes in total
  qwen/tokenizer.json         Qwen-style: NFC, Split(Qwen regex, Isolated), ByteLevel, merges as
                              ["a","b"] (tokenizers >= 0.20), + tokenizer_config.json (eos)
  qwen_old/tokenizer.json     the same model with merges written the old way, "a b"
  llama3/tokenizer.json       LLaMA-3-style: no normalizer, LLaMA-3 regex, ignore_merges=true
  gpt2/tokenizer.json         GPT-2-style: ByteLevel(add_prefix_space, use_regex) alone
  gemma/tokenizer.json        Gemma / PaliGemma-style SentencePiece BPE: Replace(" ", "▁"),
                              Split(" ", MergedWithPrevious), byte_fallback, unk + fuse_unk, <bos>
                              TemplateProcessing, Replace/ByteFallback/Fuse decoder
  llama2/tokenizer.json       the same model LLaMA-2-style: Prepend("▁") + Replace, no
                              pre-tokenizer, a Strip decoder
  llama2_unfused/             the same without Fuse before Strip (Strip per token)
  gemma_nfc/                  gemma with Sequence[NFC, Replace] as its normalizer
  gemma_partial_bytes/        gemma with 13 byte tokens renamed away: characters with a missing
  gemma_partial_bytes_unfused/  byte become <unk>, which HF holds back past later byte tokens;
                              fuse_unk true / false
  qwen_strip/, gemma_strip/   qwen and gemma with lstrip / rstrip / single_word on added tokens
  qwen_normalized/            qwen with normalized: true on its added tokens
  expected.json               {variant: {"ids": [[...] per doc], "decoded": [...],
                              "ids_special": [[...] for the first 50 docs, add_special_tokens=True],
                              "decode_cases" (SentencePiece-style variants): [[ids, HF's decode]],
                              "truncated" (same): [[max_length, [ids with special tokens, truncated]
                                                    for the first 20 docs]],
                              "offsets" (same, gemma_partial_bytes*): [[[begin, end] byte offsets per
                                                    token] for the first 80 docs],
                              "unk_cases" (gemma_partial_bytes*): [[text, ids]],
                              "strip_cases" (*_strip): [[text, ids, byte offsets per token]]}}
  nfc.json                    [[text, NFC(text)], ...] from unicodedata
"""
import json
import os
import random
import sys
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
        r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>"]

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have "
         "an they which one you were her all she there would their we him been has when who will "
         "more no if out so said what up its about into than them can only other new some could "
         "time these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down should "
         "because each just those people Mr how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take three "
         "LoongForge Megatron tokenizer PyTorch GPU naïve café résumé coöperate Zürich").split()
HANZI = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテト"
HANGUL = "한국어는세계에서가장과학적인문자입니다안녕하세요감사합니다"
EMOJI = ["😀", "🎉", "👍🏽", "👨‍👩‍👧", "🇨🇳", "🇺🇸", "❤️", "🚀", "🤖", "✨", "🧪", "🐉"]
OTHER = ["Привет мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก",
         "Tiếng Việt có dấu", "Ελληνικά", "עברית"]
COMBINING = ["e\u0301", "A\u030a", "o\u0308\u0304", "\u1100\u1161\u11a8", "\uf900", "\u212b",
             "n\u0303", "a\u0328\u0301", "\u0915\u093c", "Tie\u0302\u0301ng Vie\u0323\u0302t",
             "q\u0307\u0323", "\u00c5\u0301", "\u0041\u0301\u0316"]
SPACES = ["   ", "\t\t", "\n\n\n", " \n ", "\r\n", "  \t \n", "\u3000", "\u00a0", " " * 17, "\n" * 5]
CODE = [
    "def f(x):\n    return x ** 2 + 3*x - 1  # comment\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    "const xs = [1, 2, 3].map((v) => v * 2); // => [2, 4, 6]\n",
    "if (ptr != nullptr && ptr->next) { return *ptr; }\n",
    "    x = {'key': \"value\", 'n': 3.14e-10}\n",
]


def piece(rng):
    r = rng.random()
    if r < 0.35:
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 15))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        s = " ".join(words)
        s += rng.choice([". ", ", ", "! ", "? ", "'s ", "'LL ", " don't ", "; ", ":\n"])
        return s
    if r < 0.45:
        return "".join(rng.choice(HANZI) for _ in range(rng.randint(2, 30))) + rng.choice(["。", "，", "！", ""])
    if r < 0.50:
        return "".join(rng.choice(KANA) for _ in range(rng.randint(2, 20)))
    if r < 0.53:
        return "".join(rng.choice(HANGUL) for _ in range(rng.randint(2, 12))) + " "
    if r < 0.58:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))) + rng.choice(["", " "])
    if r < 0.66:
        return rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))), f"{rng.random() * 1000:.4f}",
                           f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                           "3.14159", "1,000,000", "0x7FFF"]) + rng.choice([" ", "", "\n"])
    if r < 0.74:
        return rng.choice(SPACES)
    if r < 0.82:
        return rng.choice(CODE)
    if r < 0.86:
        return rng.choice(SPECIALS) + rng.choice(["", "user\n", "assistant\n", " "])
    if r < 0.92:
        return rng.choice(COMBINING) + rng.choice(["", " ", "x"])
    return rng.choice(OTHER) + rng.choice([" ", "\n", "."])


def make_docs(rng, target_bytes):
    docs, total = [], 0
    while total < target_bytes:
        d = "".join(piece(rng) for _ in range(rng.randint(1, 40)))
        docs.append(d)
        total += len(d.encode())
    # Edge cases, each its own document.
    docs += ["", " ", "\n", "<|endoftext|>", "<|endoftext|><|endoftext|>", "<|im_start|><|im_end|>",
             "<|endoftext", "a<|endoftext|>b", " " * 300, "9" * 50, "😀" * 20, "e\u0301" * 5,
             "don'T WE'LL it'S", "\r\n\r\n", "tab\tsep\tvalues\t", "x" * 500]
    return docs


def main():
    out = sys.argv[1]
    target = int(sys.argv[sys.argv.index("--target-bytes") + 1]) if "--target-bytes" in sys.argv else 120_000
    rng = random.Random(20240611)
    train_text = make_docs(random.Random(7), 200_000)
    docs = make_docs(rng, target)

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text, trainer)

    variants = {}
    os.makedirs(f"{out}/qwen", exist_ok=True)
    tok.save(f"{out}/qwen/tokenizer.json")
    with open(f"{out}/qwen/tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|im_end|>"}, f)
    variants["qwen"] = f"{out}/qwen/tokenizer.json"

    spec = json.load(open(variants["qwen"]))
    merges = spec["model"]["merges"]
    assert merges and isinstance(merges[0], list), "expected the new merges format"
    old = dict(spec)
    old["model"] = dict(spec["model"], merges=[f"{a} {b}" for a, b in merges])
    os.makedirs(f"{out}/qwen_old", exist_ok=True)
    json.dump(old, open(f"{out}/qwen_old/tokenizer.json", "w"), ensure_ascii=False)
    variants["qwen_old"] = f"{out}/qwen_old/tokenizer.json"

    llama = json.loads(json.dumps(spec))
    llama["normalizer"] = None
    llama["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": LLAMA3}
    llama["model"]["ignore_merges"] = True
    os.makedirs(f"{out}/llama3", exist_ok=True)
    json.dump(llama, open(f"{out}/llama3/tokenizer.json", "w"), ensure_ascii=False)
    variants["llama3"] = f"{out}/llama3/tokenizer.json"

    gpt2 = json.loads(json.dumps(spec))  # GPT-2 style: ByteLevel alone, its built-in regex
    gpt2["normalizer"] = None
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                             "use_regex": True}
    os.makedirs(f"{out}/gpt2", exist_ok=True)
    json.dump(gpt2, open(f"{out}/gpt2/tokenizer.json", "w"), ensure_ascii=False)
    variants["gpt2"] = f"{out}/gpt2/tokenizer.json"

    # SentencePiece-style BPE as transformers' GemmaConverter writes it (PaliGemma's tokenizer):
    # spaces -> "▁", merges over characters, characters outside a small alphabet as <0xXX> byte
    # tokens, <bos> added by the post-processor. LLaMA-2's converted files: Prepend("▁") too, no
    # pre-tokenizer, a Strip decoder.
    spm = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    spm.normalizer = normalizers.Replace(" ", "▁")
    spm.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    spm.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    spm_trainer = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                      limit_alphabet=120, show_progress=False)
    spm.train_from_iterator(train_text, spm_trainer)
    gemma = json.loads(spm.to_str())
    vocab = gemma["model"]["vocab"]
    for b in range(256):  # the byte tokens are vocabulary entries, as in Gemma's
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    bos = vocab["<bos>"]
    gemma["post_processor"] = {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}}}
    os.makedirs(f"{out}/gemma", exist_ok=True)
    json.dump(gemma, open(f"{out}/gemma/tokenizer.json", "w"), ensure_ascii=False)
    variants["gemma"] = f"{out}/gemma/tokenizer.json"
    llama2 = json.loads(json.dumps(gemma))
    llama2["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                                {"type": "Replace", "pattern": {"String": " "},
                                                                 "content": "▁"}]}
    llama2["pre_tokenizer"] = None
    llama2["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    os.makedirs(f"{out}/llama2", exist_ok=True)
    json.dump(llama2, open(f"{out}/llama2/tokenizer.json", "w"), ensure_ascii=False)
    variants["llama2"] = f"{out}/llama2/tokenizer.json"
    # The Strip decoder without Fuse before it: HF strips each token's leading spaces.
    unfused = json.loads(json.dumps(llama2))
    unfused["decoder"]["decoders"] = [d for d in unfused["decoder"]["decoders"] if d["type"] != "Fuse"]
    os.makedirs(f"{out}/llama2_unfused", exist_ok=True)
    json.dump(unfused, open(f"{out}/llama2_unfused/tokenizer.json", "w"), ensure_ascii=False)
    variants["llama2_unfused"] = f"{out}/llama2_unfused/tokenizer.json"
    # A template with a suffix (<bos> text <eos>): truncation keeps the suffix.
    eos_suffix = json.loads(json.dumps(gemma))
    eos_suffix["post_processor"]["single"].append({"SpecialToken": {"id": "<eos>", "type_id": 0}})
    eos_suffix["post_processor"]["special_tokens"]["<eos>"] = {"id": "<eos>", "ids": [vocab["<eos>"]],
                                                               "tokens": ["<eos>"]}
    os.makedirs(f"{out}/gemma_eos", exist_ok=True)
    json.dump(eos_suffix, open(f"{out}/gemma_eos/tokenizer.json", "w"), ensure_ascii=False)
    variants["gemma_eos"] = f"{out}/gemma_eos/tokenizer.json"
    # NFC before Replace (a Sequence normalizer): offsets through both alignments.
    nfc_spm = json.loads(json.dumps(gemma))
    nfc_spm["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, gemma["normalizer"]]}
    os.makedirs(f"{out}/gemma_nfc", exist_ok=True)
    json.dump(nfc_spm, open(f"{out}/gemma_nfc/tokenizer.json", "w"), ensure_ascii=False)
    variants["gemma_nfc"] = f"{out}/gemma_nfc/tokenizer.json"
    # Byte fallback with byte tokens missing (4-byte UTF-8 leads, some continuation bytes): those
    # characters become <unk>, which HF holds back past the byte tokens that follow; fused and not.
    for name, fuse in (("gemma_partial_bytes", True), ("gemma_partial_bytes_unfused", False)):
        partial = json.loads(json.dumps(gemma))
        partial["model"]["fuse_unk"] = fuse
        pv = partial["model"]["vocab"]
        for b in list(range(0xF0, 0xF5)) + list(range(0x80, 0x88)):
            pv[f"<nobyte{b:02X}>"] = pv.pop(f"<0x{b:02X}>")
        os.makedirs(f"{out}/{name}", exist_ok=True)
        json.dump(partial, open(f"{out}/{name}/tokenizer.json", "w"), ensure_ascii=False)
        variants[name] = f"{out}/{name}/tokenizer.json"
    spm_variants = ["gemma", "llama2", "llama2_unfused", "gemma_eos", "gemma_nfc"]
    # HF's added-token options (RoBERTa's <mask> has lstrip, some chat models' role tokens rstrip): lstrip /
    # rstrip take the whitespace before / after a match into the token, single_word keeps a match
    # next to a word character as text. Byte-level and SentencePiece-style.
    strip_options = {"<|im_start|>": {"lstrip": True}, "<|im_end|>": {"rstrip": True},
                     "<|endoftext|>": {"single_word": True}, "<|fim_prefix|>": {"lstrip": True, "rstrip": True},
                     "<eos>": {"rstrip": True}, "<bos>": {"lstrip": True, "single_word": True},
                     "<pad>": {"lstrip": True, "rstrip": True}}
    # normalized: true (HF then matches them in the NFC-normalized text, where they read the same).
    v = json.loads(json.dumps(spec))
    for a in v["added_tokens"]:
        a["normalized"] = True
    os.makedirs(f"{out}/qwen_normalized", exist_ok=True)
    json.dump(v, open(f"{out}/qwen_normalized/tokenizer.json", "w"), ensure_ascii=False)
    variants["qwen_normalized"] = f"{out}/qwen_normalized/tokenizer.json"
    for name, base in (("qwen_strip", spec), ("gemma_strip", gemma)):
        v = json.loads(json.dumps(base))
        for a in v["added_tokens"]:
            a.update(strip_options.get(a["content"], {}))
        os.makedirs(f"{out}/{name}", exist_ok=True)
        json.dump(v, open(f"{out}/{name}/tokenizer.json", "w"), ensure_ascii=False)
        variants[name] = f"{out}/{name}/tokenizer.json"

    with open(f"{out}/docs.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    if "--corpus-only" in sys.argv:
        print(f"{len(docs)} docs, {sum(len(d.encode()) for d in docs)} bytes")
        return
    expected = {}
    for name, path in variants.items():
        t = Tokenizer.from_file(path)
        ids = [t.encode(d, add_special_tokens=False).ids for d in docs]
        expected[name] = {"ids": ids,
                          "decoded": [t.decode(i, skip_special_tokens=False) for i in ids],
                          "ids_special": [t.encode(d).ids for d in docs[:50]]}
        if name.endswith("_strip"):
            # Whitespace of several kinds around each option, words touching single_word tokens,
            # a token after another's rstrip, and no whitespace at all.
            specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|fim_prefix|>"] if name == "qwen_strip" \
                else ["<bos>", "<eos>", "<pad>"]
            around = ["", " ", "  ", "\n", " \n\t ", "\u00a0", "\u3000", "x", "_", "é", "9", ".", "\u0301"]
            texts = []
            for sp in specials:
                for l in around:
                    for r in around:
                        texts.append(f"ab{l}{sp}{r}cd")
                texts += [sp, f" {sp} ", f"{sp}{sp}", f"{sp} {sp}", f"a {sp}  {sp} b", f"  {sp}\n\n{specials[0]}  x"]
            def strip_case(x):
                enc = t.encode(x, add_special_tokens=False)
                at = [0]
                for c in x:
                    at.append(at[-1] + len(c.encode()))
                return [x, enc.ids, [[at[b], at[e]] for b, e in enc.offsets]]
            expected[name]["strip_cases"] = [strip_case(x) for x in texts]
        if name in spm_variants or name.startswith("gemma_partial_bytes"):
            # HF's offsets (characters in Python) as byte offsets, for encode_with_offsets.
            def byte_offsets(text, enc):
                at = [0]
                for c in text:
                    at.append(at[-1] + len(c.encode()))
                return [[at[b], at[e]] for b, e in enc.offsets]
            expected[name]["offsets"] = [byte_offsets(d, t.encode(d, add_special_tokens=False)) for d in docs[:80]]
        if name.startswith("gemma_partial_bytes"):
            # Unknown characters (an emoji: no <0xF0>; "Ā": no <0x80>) around ones that fall back to
            # bytes ("ꙮ", "ǅ") and ones in the vocabulary.
            texts = ["🐉ꙮ🐉", "a🐉ꙮb", "x🐉🐉ꙮꙮ🐉y", "ꙮ🐉", "🐉ꙮ", " 🐉 ꙮ🐉 z", "ĀǅĀ", "theĀꙮ🐉ǅ the", "🐉"]
            expected[name]["unk_cases"] = [[x, t.encode(x, add_special_tokens=False).ids] for x in texts]
        if name in spm_variants:
            # Byte-token runs that are not UTF-8 (one U+FFFD per byte, valid bytes of the run
            # too), runs that are, at either end, and words with leading spaces (Strip).
            byte = lambda *bs: [t.token_to_id(f"<0x{b:02X}>") for b in bs]
            words = lambda text: t.encode(text, add_special_tokens=False).ids
            cases = [byte(0xE2, 0x82) + words(" a b"), byte(0x41, 0xFF) + words(" world"),
                     words(" x") + byte(0xE2, 0x82, 0xAC), words("the") + byte(0xE2),
                     byte(0xE2, 0x82, 0xAC, 0x41) + words("  two  spaces") + byte(0x80),
                     words("  lead") + words(" and  more") + byte(0x20, 0x20, 0x41),
                     [t.token_to_id("<bos>")] + words(" hi")]
            expected[name]["decode_cases"] = [[c, t.decode(c, skip_special_tokens=False)] for c in cases]
            # truncation=True, max_length=N (N from the template's own tokens up to past the text).
            lengths = [2, 3, 5, 12, 40, 400]
            expected[name]["truncated"] = []
            for n in lengths:
                t.enable_truncation(max_length=n)
                expected[name]["truncated"].append([n, [t.encode(d).ids for d in docs[:20]]])
            t.no_truncation()
    # Special tokens that only tokenizer_config.json names: transformers (not tokenizers) registers
    # them as special added tokens, "<|fim_prefix|>" with its vocabulary id, the others new.
    v = json.loads(json.dumps(spec))
    v["added_tokens"] = [a for a in v["added_tokens"] if a["content"] != "<|fim_prefix|>"]
    assert "<|fim_prefix|>" in v["model"]["vocab"]
    d = f"{out}/qwen_config_specials"
    os.makedirs(d, exist_ok=True)
    json.dump(v, open(f"{d}/tokenizer.json", "w"), ensure_ascii=False)
    added_token = {"__type": "AddedToken", "special": True, "normalized": False, "lstrip": False, "rstrip": False,
                   "single_word": False}
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": "<s>",
               "pad_token": "<|fim_prefix|>", "unk_token": dict(added_token, content="<unk>"),
               "mask_token": dict(added_token, content="<mask>", lstrip=True), "boi_token": "<boi>",
               "extra_special_tokens": {"image_token": "<img>", "video_token": "<s>"}}, open(f"{d}/tokenizer_config.json", "w"))
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(d)
    texts = ["<s>hello<|fim_prefix|>world <img><unk>", "a<s><s> b<|im_end|>", "<im", "x <img> y<|fim_prefix|><boi>",
             "ab  <mask> c<mask>"] + docs[:20]
    expected["qwen_config_specials"] = {"size": len(hf),
                                        "cases": [[x, hf(x, add_special_tokens=False)["input_ids"]] for x in texts]}
    json.dump(expected, open(f"{out}/expected.json", "w"))

    nfc_rng = random.Random(3)
    marks = [chr(c) for c in list(range(0x300, 0x370)) + [0x1DC0, 0x20D0, 0x093C, 0x05B0, 0x0E38]]
    bases = list("aeiouAEIOUnNcCsSzZ") + ["\u1100", "\u1161", "\u11a8", "\uac00", "\uf900", "\u2126",
                                          "\u0915", "\u05d0", "\u0e01", "x", "\u00e9", "\u1e09"]
    cases = COMBINING + ["".join(nfc_rng.choice(bases) + "".join(nfc_rng.choice(marks) for _ in range(nfc_rng.randint(0, 4)))
                                 for _ in range(nfc_rng.randint(1, 6))) for _ in range(2000)]
    json.dump([[c, unicodedata.normalize("NFC", c)] for c in cases], open(f"{out}/nfc.json", "w"))
    print(f"{len(docs)} docs, {sum(len(d.encode()) for d in docs)} bytes, "
          f"vocab {tok.get_vocab_size()}, merges {len(merges)}")


if __name__ == "__main__":
    main()
