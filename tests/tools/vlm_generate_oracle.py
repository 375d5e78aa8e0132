"""Oracle for the Qwen2.5-VL tests of loongforge-generate and loongforge-convert
(tests/tools/test_generate_vlm_program.cpp). Python is a test oracle only; LoongForge never runs it.

  vlm_generate_oracle.py make OUT
      OUT/hf/      a tiny random Qwen2_5_VLForConditionalGeneration (fixed seed, fp32) as save_pretrained
                   writes it, sharded (model-0000i-of-0000n.safetensors + index), with the
                   preprocessor_config.json of a Qwen2VLImageProcessorPil with small min/max pixels;
                   vision depth 3 (window 56 px, full attention in block 1), hidden 64; LLM 2 layers,
                   hidden 64, 4 heads, 2 KV heads, mrope_section [2, 3, 3], vocab 200 (vision_start 190,
                   vision_end 191, image 192, video 193)
      OUT/a.png, OUT/b.png   two small RGB images (Pillow)
      OUT/expected.safetensors
          images_logits [s, 200]: the logits of images_ids (text, a.png's placeholders, text, b.png's,
                   text) with the processor's pixel_values of the two PNGs
          images_greedy [n]: transformers' greedy continuation of images_ids (4 tokens, no cache)
          vi_logits [s2, 200]: the logits of vi_ids with OUT/vision_inputs.safetensors
      OUT/vision_inputs.safetensors  pixel_values + image_grid_thw (the processor's, of a.png) and a short
                   random video (pixel_values_videos, video_grid_thw [[2, 4, 4]], second_per_grid_ts [0.5])
      OUT/hf_v4/     the same model in transformers 4's layout (a Hub Qwen2.5-VL's): flat text fields with
                   rope_scaling {"type": "mrope", "mrope_section": ...}, vision_config with in_chans /
                   spatial_patch_size, weights named visual.* and model.* in one model.safetensors
      OUT/text_hf/   a tiny text-only Qwen2ForCausalLM (for the errors of --image on an LLM)
      OUT/ids.json   {"images_ids": "1,2,...", "vi_ids": "...", "images_greedy": "..."} (written last)

  vlm_generate_oracle.py compare DIR_A DIR_B
      Loads both HF directories with transformers; prints "tensors N equal E" (state dicts compared
      bit for bit) and "logits D" (max |difference| of the two models' logits on a batch with an
      image and a video).
"""
import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2VLImageProcessorPil)

VISION = dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, in_channels=3, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
              out_hidden_size=64, hidden_act="silu", initializer_range=0.02, tokens_per_second=2)
TEXT = dict(vocab_size=200, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False, hidden_act="silu",
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
IDS = dict(vision_start_token_id=190, vision_end_token_id=191, image_token_id=192, video_token_id=193)
S, E, I, V = 190, 191, 192, 193


def mm_types(ids):
    return (ids == I).int() + 2 * (ids == V).int()


def load(d):
    m = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def make(out):
    os.makedirs(out, exist_ok=True)
    hf = os.path.join(out, "hf")
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(vision_config=VISION, text_config=TEXT, tie_word_embeddings=False, **IDS)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name or \
                    "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(hf, max_shard_size="600KB")
    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112)
    proc.save_pretrained(hf)
    model = load(hf)

    rng = np.random.default_rng(3)
    paths = []
    for name, (h, w) in (("a.png", (70, 100)), ("b.png", (45, 50))):
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        p = os.path.join(out, name)
        Image.fromarray(arr, "RGB").save(p)
        paths.append(p)
    images = [Image.open(p) for p in paths]
    px = proc(images=images, return_tensors="pt")
    pixel_values, grid = px["pixel_values"], px["image_grid_thw"]
    counts = [int(x) for x in (grid.prod(-1) // 4)]

    def text(n):
        return torch.randint(0, 180, (n,), generator=g).tolist()
    row = text(3) + [S] + [I] * counts[0] + [E] + text(4) + [S] + [I] * counts[1] + [E] + text(5)
    ids = torch.tensor([row])
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid,
                       mm_token_type_ids=mm_types(ids)).logits[0]
        seq, greedy = ids, []
        for _ in range(4):  # greedy, the whole sequence recomputed each step
            nxt = int(model(input_ids=seq, pixel_values=pixel_values, image_grid_thw=grid,
                            mm_token_type_ids=mm_types(seq)).logits[0, -1].argmax())
            greedy.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)

        # vision inputs: a.png's rows and a 2-step 4x4 video at 0.5 s per grid step.
        a = proc(images=[images[0]], return_tensors="pt")
        video_grid = torch.tensor([[2, 4, 4]])
        videos = torch.randn(32, 3 * 2 * 14 * 14, generator=g)
        seconds = torch.tensor([0.5])
        na = int(a["image_grid_thw"].prod(-1)[0]) // 4
        vrow = text(2) + [S] + [V] * 8 + [E] + text(3) + [S] + [I] * na + [E] + text(4)
        vids = torch.tensor([vrow])
        vi_logits = model(input_ids=vids, pixel_values=a["pixel_values"], image_grid_thw=a["image_grid_thw"],
                          pixel_values_videos=videos, video_grid_thw=video_grid, second_per_grid_ts=seconds,
                          mm_token_type_ids=mm_types(vids)).logits[0]
    save_file({"pixel_values": a["pixel_values"].float().contiguous(), "image_grid_thw": a["image_grid_thw"],
               "pixel_values_videos": videos, "video_grid_thw": video_grid, "second_per_grid_ts": seconds},
              os.path.join(out, "vision_inputs.safetensors"))
    save_file({"images_logits": logits.contiguous(), "images_greedy": torch.tensor(greedy),
               "vi_logits": vi_logits.contiguous(), "images_pixel_values": pixel_values.float().contiguous(),
               "images_grid": grid}, os.path.join(out, "expected.safetensors"))
    v4 = os.path.join(out, "hf_v4")
    os.makedirs(v4)
    flat = {k: v for k, v in TEXT.items() if k != "rope_parameters"}
    vision4 = {k: v for k, v in VISION.items() if k not in ("in_channels",)}
    vision4.update(in_chans=3, spatial_patch_size=14)
    cfg4 = dict(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl", torch_dtype="float32",
                rope_theta=10000.0, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, sliding_window=4096,
                use_sliding_window=False, max_window_layers=2, vision_config=vision4, **flat, **IDS)
    with open(os.path.join(v4, "config.json"), "w") as f:
        json.dump(cfg4, f, indent=1)
    renamed = {}
    for k, v in model.state_dict().items():
        if k.startswith("model.visual."):
            k = k[len("model."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        renamed[k] = v.contiguous()
    save_file(renamed, os.path.join(v4, "model.safetensors"), metadata={"format": "pt"})
    text_only = {k: v for k, v in TEXT.items() if k != "rope_parameters"}
    Qwen2ForCausalLM(Qwen2Config(**text_only)).save_pretrained(os.path.join(out, "text_hf"))
    with open(os.path.join(out, "ids.json"), "w") as f:
        json.dump({"images_ids": ",".join(map(str, row)), "vi_ids": ",".join(map(str, vrow)),
                   "images_greedy": ",".join(map(str, greedy))}, f)


def compare(a_dir, b_dir):
    a, b = load(a_dir), load(b_dir)
    sa, sb = a.state_dict(), b.state_dict()
    equal = sum(1 for k in sa if k in sb and sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]))
    print(f"tensors {len(sa)} {len(sb)} equal {equal}")
    g = torch.Generator().manual_seed(5)
    grid, video_grid = torch.tensor([[1, 4, 6]]), torch.tensor([[2, 4, 4]])
    px = torch.randn(24, 1176, generator=g)
    pv = torch.randn(32, 1176, generator=g)
    ids = torch.tensor([[5, 6, S] + [I] * 6 + [E, 7, S] + [V] * 8 + [E, 9, 10]])
    kw = dict(input_ids=ids, pixel_values=px, image_grid_thw=grid, pixel_values_videos=pv, video_grid_thw=video_grid,
              second_per_grid_ts=torch.tensor([1.0]), mm_token_type_ids=mm_types(ids))
    with torch.no_grad():
        d = (a(**kw).logits - b(**kw).logits).abs().max().item()
    print(f"logits {d:.3e}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
