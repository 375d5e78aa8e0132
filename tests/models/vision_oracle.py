"""HF transformers oracle for the Qwen2.5-VL vision tower test (tests/models/test_qwen2_5_vl_vision.cpp).
Python is a test oracle only; LoongForge never runs it.

  vision_oracle.py make OUT
      A tiny random Qwen2_5_VisionTransformerPretrainedModel (fixed seed; depth 4 with full attention
      in blocks 1 and 3, hidden 64, 4 heads, intermediate 96, out_hidden 48, window_size 56: windows of
      2x2 merge units, so every image below spans several windows, some cut short at its edge; every
      weight, bias and norm weight random), fp32, eager attention:
        OUT/config.json          its vision config (transformers' Qwen2_5_VLVisionConfig fields)
        OUT/weights.safetensors  its tensors under the names a Qwen2.5-VL checkpoint gives them
                                 (visual.patch_embed.proj.weight, visual.blocks.N.*, visual.merger.*)
        OUT/io.safetensors       pixel_values [n, 1176] fp32 and grid_thw [4, 3] int64: three random
                                 uint8 RGB images (56x84, 112x112, 28x196) through transformers'
                                 Qwen2VLImageProcessor(Pil) and a 4-frame 56x56 "video" (grid 2x4x4,
                                 random normalised values); `output` [n / 4, 48]: the model's merged
                                 output (pooler_output) for all four at once; `probe` [n / 4, 48]
                                 random and the gradients of sum(output * probe) with respect to
                                 pixel_values, the patch embedding (as [64, 1176]), block 0's norm1
                                 and down_proj weights and the merger's first linear weight.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

CONFIG = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=4, in_channels=3, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1, 3],
              out_hidden_size=48, hidden_act="silu", initializer_range=0.02)


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen2_5_VLVisionConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "ln_q" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))

    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, size=(hgt, wid, 3), dtype=np.uint8) for hgt, wid in ((56, 84), (112, 112),
                                                                                         (28, 196))]
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=14 * 14 * 4 * 1280)
    inputs = processor(images=images, return_tensors="pt")
    pixel_values = inputs["pixel_values"].float()
    grid = inputs["image_grid_thw"].long()
    want = torch.tensor([[1, 4, 6], [1, 8, 8], [1, 2, 14]])
    assert torch.equal(grid, want), f"the processor resized the images: {grid.tolist()}"
    video_grid = torch.tensor([[2, 4, 4]])
    video = torch.randn(2 * 4 * 4, pixel_values.shape[1], generator=g)
    pixel_values = torch.cat([pixel_values, video], 0).contiguous()
    grid = torch.cat([grid, video_grid], 0).contiguous()

    # Backward too: the gradients of sum(output * probe) (a fixed random probe).
    pixels = pixel_values.clone().requires_grad_(True)
    output = model(hidden_states=pixels, grid_thw=grid).pooler_output
    assert output.shape == (pixel_values.shape[0] // 4, CONFIG["out_hidden_size"]), output.shape
    probe = torch.randn(output.shape, generator=g)
    (output * probe).sum().backward()
    output = output.detach()
    params = dict(model.named_parameters())
    grads = {"grad_pixel_values": pixels.grad,
             "grad_patch_embed": params["patch_embed.proj.weight"].grad.reshape(CONFIG["hidden_size"], -1),
             "grad_block0_norm1": params["blocks.0.norm1.weight"].grad,
             "grad_block0_down_proj": params["blocks.0.mlp.down_proj.weight"].grad,
             "grad_merger_fc1": params["merger.mlp.0.weight"].grad}

    save_file({"visual." + k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(out, "weights.safetensors"))
    save_file({"pixel_values": pixel_values, "grid_thw": grid, "output": output.contiguous(), "probe": probe,
               **{k: v.contiguous() for k, v in grads.items()}},
              os.path.join(out, "io.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
