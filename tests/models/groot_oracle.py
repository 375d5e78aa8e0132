"""The GR00T oracle: LeRobot 0.6's GR00T N1.7 model (lerobot.policies.groot.groot_n1_7.GR00TN17, run
with the LeRobot venv, .venv-lerobot).

`make DIR` writes tiny GR00T N1.7 models built offline (a tiny Qwen3-VL backbone config beside
them, every weight randomised), saved with transformers' save_pretrained as NVIDIA publishes the
model, and for each a fixed batch as GR00TN17.forward takes it after LeRobot's processor, with
fixed noise and time (torch.randn and the Beta draw replaced for the call), the loss and
per-element loss of GR00TN17.forward and the actions of GR00TN17.get_action (Euler, fixed noise):

  DIR/<case>/backbone/              the Qwen3-VL config.json the model's `model_name` points to
  DIR/<case>/model/                 config.json + model.safetensors (save_pretrained)
  DIR/<case>/inputs.safetensors     input_ids, attention_mask, pixel_values, image_grid_thw, state,
                                    action, action_mask, embodiment_id, noise, time, sample_noise
  DIR/<case>/expected.safetensors   loss [], action_loss [b, horizon, max_action_dim], actions
  DIR/done

Cases: `alternate` (AlternateVLDiT: cross-attention alternating between text and image tokens,
a VL self-attention layer, position embedding) and `plain` (DiT over every backbone token, no VL
self-attention, no LayerNorm on the features, no position embedding).
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from safetensors.torch import save_file
from transformers import Qwen3VLConfig

from lerobot.policies.groot import groot_n1_7 as g

IDS = dict(image_token_id=50, video_token_id=51, vision_start_token_id=52, vision_end_token_id=53)
PATCH = 3 * 2 * 4 * 4  # channels x temporal patch x patch x patch


def backbone_config(layers, deepstack):
    return Qwen3VLConfig(
        **IDS, tie_word_embeddings=True,
        text_config=dict(head_dim=8, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                         num_hidden_layers=layers, num_key_value_heads=2, rms_norm_eps=1e-6,
                         rope_scaling=dict(mrope_interleaved=True, mrope_section=[2, 1, 1], rope_type="default"),
                         rope_theta=10000, vocab_size=64, tie_word_embeddings=True, max_position_embeddings=256),
        vision_config=dict(deepstack_visual_indexes=deepstack, depth=2, hidden_size=32, intermediate_size=40,
                           num_heads=2, num_position_embeddings=16, out_hidden_size=32, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2))


def make_case(out, name, seed, alternate, b, horizon, max_state, max_action, embodiments, select_layer, **extra):
    d = os.path.join(out, name)
    os.makedirs(d)
    backbone_config(4, [0]).save_pretrained(os.path.join(d, "backbone"))
    torch.manual_seed(seed)
    cfg = g.GR00TN17Config(
        model_name=os.path.join(d, "backbone"), backbone_embedding_dim=32, select_layer=select_layer,
        max_state_dim=max_state, max_action_dim=max_action, action_horizon=horizon, hidden_size=24,
        input_embedding_dim=20, max_seq_len=16, max_num_embodiments=embodiments, use_alternate_vl_dit=alternate,
        diffusion_model_cfg=dict(positional_embeddings=None, num_layers=4, num_attention_heads=2,
                                 attention_head_dim=10, norm_type="ada_norm", dropout=0.2, final_dropout=True,
                                 output_dim=24, interleave_self_attention=True),
        num_inference_timesteps=3, state_dropout_prob=0.2, **extra)
    model = g.GR00TN17(cfg, transformers_loading_kwargs={}, load_backbone_weights=False)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            norm = ("norm" in pname or "vlln" in pname) and pname.endswith("weight") and p.dim() == 1
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if norm else 0.1 * torch.randn_like(p))
        model.backbone.model.lm_head.weight.copy_(model.backbone.model.model.language_model.embed_tokens.weight)
    model.eval()
    model.save_pretrained(os.path.join(d, "model"))

    gen = torch.Generator().manual_seed(seed + 1)
    grid = torch.tensor([[1, 4, 4]] * b)  # 16 patches -> 4 placeholders per sample
    S, E, I = IDS["vision_start_token_id"], IDS["vision_end_token_id"], IDS["image_token_id"]
    rows = []
    for i in range(b):
        text = torch.randint(0, 48, (5,), generator=gen).tolist()
        rows.append(text[:2 + i] + [S] + [I] * 4 + [E] + text[2 + i:])
    input_ids = torch.tensor(rows)
    attention_mask = torch.ones_like(input_ids)
    pixel_values = torch.randn(int(grid.prod(-1).sum()), PATCH, generator=gen)
    state = torch.randn(b, 1, max_state, generator=gen)
    action = torch.randn(b, horizon, max_action, generator=gen)
    action_mask = torch.ones(b, horizon, max_action)
    action_mask[:, :, max_action - 1] = 0
    action_mask[b - 1, horizon - 1] = 0
    embodiment_id = torch.arange(b) % embodiments
    noise = torch.randn(b, horizon, max_action, generator=gen)
    time = torch.rand(b, generator=gen) * 0.9 + 0.05
    sample_noise = torch.randn(b, horizon, max_action, generator=gen)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                  image_grid_thw=grid, state=state, action=action, action_mask=action_mask,
                  embodiment_id=embodiment_id)

    randn = torch.randn
    try:
        model.action_head.sample_time = lambda n, device, dtype: time.to(device, dtype)
        torch.randn = lambda *a, **k: noise.clone()
        with torch.no_grad():
            out = model.forward(dict(inputs))
        torch.randn = lambda *a, **k: sample_noise.clone()
        with torch.no_grad():
            actions = model.get_action({k: v for k, v in inputs.items() if k not in ("action", "action_mask")})[
                "action_pred"]
    finally:
        torch.randn = randn
    save_file({**inputs, "noise": noise, "time": time, "sample_noise": sample_noise},
              os.path.join(d, "inputs.safetensors"))
    save_file({"loss": out["loss"].float().reshape([]).contiguous(),
               "action_loss": out["action_loss"].float().contiguous(), "actions": actions.float().contiguous()},
              os.path.join(d, "expected.safetensors"))


def make(out):
    make_case(out, "alternate", 3, True, b=2, horizon=4, max_state=6, max_action=5, embodiments=3, select_layer=2,
              vl_self_attention_cfg=dict(positional_embeddings=None, num_layers=1, num_attention_heads=2,
                                         attention_head_dim=16, dropout=0.2, final_dropout=True))
    make_case(out, "plain", 5, False, b=3, horizon=3, max_state=4, max_action=6, embodiments=2, select_layer=3,
              vl_self_attention_cfg=dict(num_layers=0), use_vlln=False, add_pos_embed=False)
    open(os.path.join(out, "done"), "w").close()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: groot_oracle.py make DIR")
    make(sys.argv[2])
