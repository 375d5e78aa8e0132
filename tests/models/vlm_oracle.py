"""HF transformers oracle for the Qwen2.5-VL end-to-end test (tests/models/test_qwen2_5_vl.cpp).
Python is a test oracle only; LoongForge never runs it.

  vlm_oracle.py make OUT
      A tiny random Qwen2_5_VLForConditionalGeneration (fixed seed, fp32, eager attention): vision depth 3
      (full attention in block 1, windows of 56 px elsewhere), hidden 64, out_hidden 64; LLM 2 layers,
      hidden 64, 4 heads, 2 KV heads, head_dim 16, mrope_section [2, 3, 3], vocab 200 (vision_start 190,
      vision_end 191, image 192, video 193), untied head; every weight random.
        OUT/config.json          {"text": the LLM's fields, "vision": the tower's, ids, tokens_per_second}
        OUT/weights.safetensors  the model's state dict under a checkpoint's names (model.visual.*,
                                 model.language_model.*, lm_head.weight)
        OUT/io.safetensors       input_ids [2, 25] (sample 0 holds a 4x6-patch image, sample 1 an 8x8 one,
                                 each between vision_start and vision_end amid text), pixel_values [88, 1176]
                                 random, image_grid_thw [2, 3]; position_ids [3, 2, 25] from
                                 get_rope_index; logits [2, 25, 200]; text_ids [2, 12] and text_logits
                                 [2, 12, 200] (a text-only batch, 1D positions); the media batch mv_*:
                                 mv_ids [2, 30] (sample 0 a 4x4-patch image then a 2-step 4x4 video at 0.5 s
                                 per grid step, sample 1 a 1x4x8 video), mv_pixel_values [16, 1176],
                                 mv_image_grid [1, 3], mv_pixel_values_videos [64, 1176], mv_video_grid
                                 [2, 3], mv_seconds [2], mv_position_ids [3, 2, 30], mv_logits [2, 30, 200].
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

VISION = dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=4, in_channels=3, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
              out_hidden_size=64, hidden_act="silu", initializer_range=0.02, tokens_per_second=2)
TEXT = dict(vocab_size=200, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False, hidden_act="silu",
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
IDS = dict(vision_start_token_id=190, vision_end_token_id=191, image_token_id=192, video_token_id=193)


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(vision_config=VISION, text_config=TEXT, tie_word_embeddings=False, **IDS)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm1" in name or "norm2" in name or "ln_q" in name or \
                    "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))

    grid = torch.tensor([[1, 4, 6], [1, 8, 8]])
    pixel_values = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=g)
    S, E, I = IDS["vision_start_token_id"], IDS["vision_end_token_id"], IDS["image_token_id"]

    def text(n):
        return torch.randint(0, 180, (n,), generator=g).tolist()
    row0 = text(5) + [S] + [I] * 6 + [E] + text(12)
    row1 = text(3) + [S] + [I] * 16 + [E] + text(4)
    input_ids = torch.tensor([row0, row1])
    mm = (input_ids == I).int()
    with torch.no_grad():
        position_ids, _ = model.model.get_rope_index(input_ids, mm_token_type_ids=mm, image_grid_thw=grid)
        logits = model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid,
                       mm_token_type_ids=mm).logits
        text_ids = torch.randint(0, 180, (2, 12), generator=g)
        text_logits = model(input_ids=text_ids).logits
        # Images and videos together: sample 0 an image then a video, sample 1 a video.
        V = IDS["video_token_id"]
        mv_image_grid = torch.tensor([[1, 4, 4]])
        mv_video_grid = torch.tensor([[2, 4, 4], [1, 4, 8]])
        mv_seconds = torch.tensor([0.5, 1.0])
        mv_pixel_values = torch.randn(16, 3 * 2 * 14 * 14, generator=g)
        mv_pixel_values_videos = torch.randn(32 + 32, 3 * 2 * 14 * 14, generator=g)
        mrow0 = text(2) + [S] + [I] * 4 + [E] + text(3) + [S] + [V] * 8 + [E] + text(9)
        mrow1 = text(4) + [S] + [V] * 8 + [E] + text(30 - 14)
        mv_ids = torch.tensor([mrow0, mrow1])
        mv_mm = (mv_ids == I).int() + 2 * (mv_ids == V).int()
        mv_position_ids, _ = model.model.get_rope_index(mv_ids, mm_token_type_ids=mv_mm, image_grid_thw=mv_image_grid,
                                                        video_grid_thw=mv_video_grid, second_per_grid_ts=mv_seconds)
        mv_logits = model(input_ids=mv_ids, pixel_values=mv_pixel_values, image_grid_thw=mv_image_grid,
                          pixel_values_videos=mv_pixel_values_videos, video_grid_thw=mv_video_grid,
                          second_per_grid_ts=mv_seconds, mm_token_type_ids=mv_mm).logits

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "weights.safetensors"))
    save_file({"input_ids": input_ids, "pixel_values": pixel_values, "image_grid_thw": grid,
               "position_ids": position_ids.contiguous(), "logits": logits.contiguous(),
               "text_ids": text_ids, "text_logits": text_logits.contiguous(),
               "mv_ids": mv_ids, "mv_pixel_values": mv_pixel_values, "mv_image_grid": mv_image_grid,
               "mv_pixel_values_videos": mv_pixel_values_videos, "mv_video_grid": mv_video_grid,
               "mv_seconds": mv_seconds, "mv_position_ids": mv_position_ids.contiguous(),
               "mv_logits": mv_logits.contiguous()},
              os.path.join(out, "io.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"text": TEXT, "vision": VISION, **IDS}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
