"""HF transformers oracle for the InternVL tests (tests/models/test_internvl.cpp).
Python is a test oracle only; LoongForge never runs it.

  internvl_oracle.py make OUT
      A tiny random InternVLForConditionalGeneration (fixed seed, fp32, eager attention): InternViT of 2
      layers, hidden 32, 2 heads, intermediate 48, 56 x 56-pixel tiles of 14-pixel patches (a 4 x 4 grid,
      pixel-shuffled to 2 x 2), q/k bias and RMSNorm, a final LayerNorm (use_mean_pooling false); a qwen2
      LLM of 2 layers, hidden 64, 4 heads, 2 KV heads, vocab 200 (image token 190), untied head; every
      weight random.
        OUT/config.json          {"text": the LLM's fields, "vision": the tower's, the projector's fields, ids}
        OUT/weights.safetensors  the model's state dict (model.vision_tower.*, model.multi_modal_projector.*,
                                 model.language_model.*, lm_head.weight)
        OUT/hf/                  the same model as save_pretrained writes it (config.json, model.safetensors)
        OUT/io.safetensors
          input_ids [2, 22] (sample 0 holds two tiles of one image, 8 placeholders, sample 1 one tile, 4),
          pixel_values [3, 3, 56, 56]; logits [2, 22, 200]; logits_layer_m2 (vision_feature_layer -2: the
          tower's second-to-last hidden state, no final norm); text_ids [2, 10], text_logits.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import InternVLConfig, InternVLForConditionalGeneration

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, image_size=56,
              patch_size=14, attention_bias=True, use_qk_norm=True, norm_type="layer_norm", layer_norm_eps=1e-6,
              use_mean_pooling=False, hidden_act="gelu", layer_scale_init_value=0.1)
TEXT = dict(model_type="qwen2", vocab_size=200, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
            hidden_act="silu", tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
IDS = dict(image_token_id=190)
TOP = dict(downsample_ratio=0.5, projector_hidden_act="gelu", vision_feature_layer=-1,
           vision_feature_select_strategy="default")


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = InternVLConfig(vision_config=VISION, text_config=TEXT, tie_word_embeddings=False, image_seq_length=4,
                            **IDS, **TOP)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = InternVLForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "lambda" in name or "position_embeddings" in name or "cls_token" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    I = IDS["image_token_id"]

    def text(n):
        return torch.randint(0, 180, (n,), generator=g).tolist()

    row0 = text(3) + [I] * 8 + text(11)
    row1 = text(5) + [I] * 4 + text(13)
    input_ids = torch.tensor([row0, row1])
    pixel_values = torch.randn(3, 3, 56, 56, generator=g)
    with torch.no_grad():
        logits = model(input_ids=input_ids, pixel_values=pixel_values).logits
        logits_m2 = model(input_ids=input_ids, pixel_values=pixel_values, vision_feature_layer=-2).logits
        text_ids = torch.randint(0, 180, (2, 10), generator=g)
        text_logits = model(input_ids=text_ids).logits
    tensors = {"input_ids": input_ids, "pixel_values": pixel_values, "logits": logits, "logits_layer_m2": logits_m2,
               "text_ids": text_ids, "text_logits": text_logits}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "weights.safetensors"))
    model.save_pretrained(os.path.join(out, "hf"))
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.path.join(out, "io.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"text": TEXT, "vision": VISION, **TOP, **IDS}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
