"""Oracle for the multimodal store test (tests/data/test_multimodal.cpp): a Qwen2-VL-style tokenizer
directory, images, conversations in the formats users have, and what transformers makes of them.

usage: vlm_data_oracle.py make DIR

DIR/tok/                  tokenizer.json (the chat oracle's BPE + Qwen-VL's vision tokens),
                          tokenizer_config.json, chat_template.jinja (Qwen2-VL's template, which
                          renders <|vision_start|><|image_pad|><|vision_end|> per image entry),
                          preprocessor_config.json (Qwen2VLImageProcessorPil, small pixel bounds)
DIR/img/*.png|jpg         images of several sizes
DIR/conversations.jsonl   messages + <image> tags, LLaVA conversations + image, typed content
                          entries with paths, text only, two images in one sample
DIR/expected.safetensors  per sample i: s{i}/input_ids (the rendered template with each
                          <|image_pad|> repeated grid / merge^2 times, as Qwen2_5_VLProcessor
                          expands it, tokenized), s{i}/pixel_values and s{i}/grid (the image
                          processor on the sample's images in order)
"""
import json
import os
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_template_oracle import train_tokenizer  # noqa: E402

QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PRE = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}


def make(d):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    os.makedirs(f"{d}/tok", exist_ok=True)
    os.makedirs(f"{d}/img", exist_ok=True)
    base = train_tokenizer(f"{d}/base")
    tok = Tokenizer.from_file(base)
    tok.add_special_tokens(VISION_TOKENS)
    tok.save(f"{d}/tok/tokenizer.json")
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
               "tokenizer_class": "PreTrainedTokenizerFast"}, open(f"{d}/tok/tokenizer_config.json", "w"))
    open(f"{d}/tok/chat_template.jinja", "w").write(QWEN2_VL_TEMPLATE)
    proc = Qwen2VLImageProcessorPil(size={"shortest_edge": PRE["min_pixels"], "longest_edge": PRE["max_pixels"]})
    proc.save_pretrained(f"{d}/tok")

    rng = np.random.default_rng(3)
    sizes = {"a.png": (50, 70), "b.jpg": (120, 90), "c.png": (33, 200), "d.png": (64, 64)}
    for name, (h, w) in sizes.items():
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(f"{d}/img/{name}", quality=90) if name.endswith("jpg") else \
            Image.fromarray(arr).save(f"{d}/img/{name}")

    lines = [
        {"messages": [{"role": "user", "content": "<image>What colour is the square?"},
                      {"role": "assistant", "content": "It is red."}], "images": ["img/a.png"]},
        {"id": "llava-1", "image": "img/b.jpg",
         "conversations": [{"from": "human", "value": "<image>\nDescribe the picture."},
                           {"from": "gpt", "value": "A noisy picture."},
                           {"from": "human", "value": "Anything else?"}, {"from": "gpt", "value": "No."}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "image", "image": "img/c.png"},
                                                   {"type": "text", "text": "Is it wide?"}]},
                      {"role": "assistant", "content": "Yes."}]},
        {"messages": [{"role": "user", "content": "No picture here."}, {"role": "assistant", "content": "Fine."}]},
        {"messages": [{"role": "user", "content": "Compare <image> and <image>."},
                      {"role": "assistant", "content": "The second is square."}], "images": ["img/a.png", "img/d.png"]},
    ]
    with open(f"{d}/conversations.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")

    # What transformers makes of each: the template on typed entries, <|image_pad|> expanded by the
    # image processor's grid (Qwen2_5_VLProcessor's rule), tokenized; the processor's pixels.
    hf = AutoTokenizer.from_pretrained(f"{d}/tok")
    samples = [
        ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}]},
          {"role": "assistant", "content": "It is red."}], ["a.png"]),
        ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nDescribe the picture."}]},
          {"role": "assistant", "content": "A noisy picture."}, {"role": "user", "content": "Anything else?"},
          {"role": "assistant", "content": "No."}], ["b.jpg"]),
        ([{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it wide?"}]},
          {"role": "assistant", "content": "Yes."}], ["c.png"]),
        ([{"role": "user", "content": "No picture here."}, {"role": "assistant", "content": "Fine."}], []),
        ([{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                       {"type": "text", "text": " and "}, {"type": "image"},
                                       {"type": "text", "text": "."}]},
          {"role": "assistant", "content": "The second is square."}], ["a.png", "d.png"]),
    ]
    tensors = {}
    for i, (msgs, images) in enumerate(samples):
        text = hf.apply_chat_template(msgs, tokenize=False)
        if images:
            out = proc(images=[Image.open(f"{d}/img/{n}") for n in images], return_tensors="np")
            grids = out["image_grid_thw"]
            parts = text.split("<|image_pad|>")
            assert len(parts) == len(images) + 1
            text = parts[0] + "".join("<|image_pad|>" * int(g.prod() // 4) + p for g, p in zip(grids, parts[1:]))
            tensors[f"s{i}/pixel_values"] = out["pixel_values"].astype(np.float32)
            tensors[f"s{i}/grid"] = grids.astype(np.int64)
        ids = hf(text, add_special_tokens=False)["input_ids"]
        tensors[f"s{i}/input_ids"] = np.array(ids, np.int64)
    from safetensors.numpy import save_file
    save_file(tensors, f"{d}/expected.safetensors")
    json.dump({"samples": len(samples), "image_pad": hf.convert_tokens_to_ids("<|image_pad|>"),
               "video_pad": hf.convert_tokens_to_ids("<|video_pad|>"), "vocab": len(hf)},
              open(f"{d}/cases.json", "w"))
    open(f"{d}/done", "w").write("ok")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
