"""HF transformers oracle for the Qwen3-VL tests (tests/models/test_qwen3_vl.cpp).
Python is a test oracle only; LoongForge never runs it.

  qwen3_vl_oracle.py make OUT
      A tiny random Qwen3VLForConditionalGeneration (fixed seed, fp32, eager attention): vision depth 3,
      hidden 64, 4 heads, intermediate 96, patch 16, a 6 x 6 learned position table, DeepStack after
      blocks 0 and 2, out_hidden 64; LLM 3 layers (DeepStack adds after layers 0 and 1), hidden 64, 4 heads,
      2 KV heads, head_dim 16, interleaved mrope_section [4, 2, 2], vocab 200 (vision_start 190,
      vision_end 191, image 192, video 193), untied head; every weight random (the position table with
      std 1 so its interpolation shows). Pixel rows are random (transformers' Qwen3-VL image processor
      needs torchvision); grids as the processor would give them.
        OUT/config.json          {"text": the LLM's fields, "vision": the tower's, ids}
        OUT/weights.safetensors  the model's state dict (model.visual.*, model.language_model.*, lm_head.weight)
        OUT/hf/                  the same model as save_pretrained writes it (config.json, model.safetensors)
        OUT/io.safetensors
          vision_pixel_values [120, 1536], vision_grid [3, 3] (images 4x6, 8x8 and a 2x4x4 video in one
            call); vision_merged [30, 64], vision_deepstack_0/1 [30, 64]: the tower's outputs;
            vision_probe_*: random probes and grad_*: the gradients of sum(merged * probe_m + deepstack_k *
            probe_k) for pixel_values, patch_embed.proj.weight (as [64, 1536]), pos_embed.weight and block 0's
            linear_fc1.weight;
          input_ids [2, 25] (sample 0 holds a 4x6-patch image, sample 1 an 8x8 one, each between
            vision_start and vision_end amid text), pixel_values [88, 1536], image_grid_thw [2, 3];
            position_ids [3, 2, 25] from get_rope_index; logits [2, 25, 200]; logits_without_deepstack
            (the same with DeepStack switched off, to show it matters);
          text_ids [2, 12] and text_logits [2, 12, 200] (a text-only batch);
          video_ids [1, 28] (text, an image 4x6, text, a 2-frame video of 4x4 patches, each frame between
            vision_start and vision_end after a timestamp-like text token, text), video_pixel_values
            [24, 1536], video_image_grid [1, 3], pixel_values_videos [32, 1536], video_grid_thw [1, 3];
            video_position_ids [3, 1, 28]; video_logits [1, 28, 200].
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

VISION = dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, in_channels=3, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=36,
              deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh", initializer_range=0.02)
TEXT = dict(vocab_size=200, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, hidden_act="silu",
            attention_bias=False,
            rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
                             "rope_theta": 10000.0})
IDS = dict(vision_start_token_id=190, vision_end_token_id=191, image_token_id=192, video_token_id=193)
PATCH = 3 * 2 * 16 * 16


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen3VLConfig(vision_config=VISION, text_config=TEXT, tie_word_embeddings=False, **IDS)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = Qwen3VLForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "pos_embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    tensors = {}

    # The tower alone: two images and a 2-frame video in one call, forward and backward.
    visual = model.model.visual
    vgrid = torch.tensor([[1, 4, 6], [1, 8, 8], [2, 4, 4]])
    vpixels = torch.randn(int(vgrid.prod(-1).sum()), PATCH, generator=g)
    pixels = vpixels.clone().requires_grad_(True)
    vout = visual(pixels, grid_thw=vgrid)
    outs = [vout.pooler_output] + list(vout.deepstack_features)
    probes = [torch.randn(o.shape, generator=g) for o in outs]
    sum((o * p).sum() for o, p in zip(outs, probes)).backward()
    params = dict(visual.named_parameters())
    tensors.update({"vision_pixel_values": vpixels, "vision_grid": vgrid,
                    "vision_merged": vout.pooler_output.detach(),
                    "vision_probe_merged": probes[0],
                    "grad_pixel_values": pixels.grad,
                    "grad_patch_embed": params["patch_embed.proj.weight"].grad.reshape(VISION["hidden_size"], -1),
                    "grad_pos_embed": params["pos_embed.weight"].grad,
                    "grad_block0_fc1": params["blocks.0.mlp.linear_fc1.weight"].grad})
    for k, (o, p) in enumerate(zip(outs[1:], probes[1:])):
        tensors[f"vision_deepstack_{k}"] = o.detach()
        tensors[f"vision_probe_deepstack_{k}"] = p
    model.zero_grad()

    S, E, I, V = (IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id",
                                   "video_token_id"))

    def text(n):
        return torch.randint(0, 180, (n,), generator=g).tolist()

    grid = torch.tensor([[1, 4, 6], [1, 8, 8]])
    pixel_values = torch.randn(int(grid.prod(-1).sum()), PATCH, generator=g)
    row0 = text(5) + [S] + [I] * 6 + [E] + text(12)
    row1 = text(3) + [S] + [I] * 16 + [E] + text(4)
    input_ids = torch.tensor([row0, row1])
    mm = (input_ids == I).int()
    with torch.no_grad():
        position_ids, _ = model.model.get_rope_index(input_ids, mm_token_type_ids=mm, image_grid_thw=grid)
        logits = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                       mm_token_type_ids=mm).logits
        lm = model.model.language_model
        original = lm._deepstack_process
        lm._deepstack_process = lambda hidden, mask, embeds: hidden
        plain = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                      mm_token_type_ids=mm).logits
        lm._deepstack_process = original
        text_ids = torch.randint(0, 180, (2, 12), generator=g)
        text_logits = model(input_ids=text_ids).logits
    tensors.update({"input_ids": input_ids, "pixel_values": pixel_values, "image_grid_thw": grid,
                    "position_ids": position_ids, "logits": logits, "logits_without_deepstack": plain,
                    "text_ids": text_ids, "text_logits": text_logits})

    # An image and a 2-frame video in one sample (images' and videos' DeepStack rows interleaved).
    igrid = torch.tensor([[1, 4, 6]])
    ipixels = torch.randn(24, PATCH, generator=g)
    video_grid = torch.tensor([[2, 4, 4]])
    video_pixels = torch.randn(32, PATCH, generator=g)
    row = text(2) + [S] + [I] * 6 + [E] + text(2) + [S] + [V] * 4 + [E] + text(1) + [S] + [V] * 4 + [E] + text(3)
    video_ids = torch.tensor([row])
    mm = (video_ids == I).int() + 2 * (video_ids == V).int()
    with torch.no_grad():
        video_positions, _ = model.model.get_rope_index(video_ids, mm_token_type_ids=mm, image_grid_thw=igrid,
                                                        video_grid_thw=video_grid)
        video_logits = model(input_ids=video_ids, pixel_values=ipixels, image_grid_thw=igrid,
                             pixel_values_videos=video_pixels, video_grid_thw=video_grid,
                             mm_token_type_ids=mm).logits
    tensors.update({"video_ids": video_ids, "video_pixel_values": ipixels, "video_image_grid": igrid,
                    "pixel_values_videos": video_pixels, "video_grid_thw": video_grid,
                    "video_position_ids": video_positions, "video_logits": video_logits})

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "weights.safetensors"))
    model.save_pretrained(os.path.join(out, "hf"))
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.path.join(out, "io.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"text": TEXT, "vision": VISION, **IDS}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
