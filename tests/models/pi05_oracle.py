"""The pi05 oracle: LeRobot 0.6's PI05Policy (run with the LeRobot venv, .venv-lerobot).

`make DIR` writes tiny pi05 policies built offline by shrinking LeRobot's variants (gemma_2b,
gemma_300m, SigLIP so400m) with every weight randomised, saved with LeRobot's save_pretrained, and
for each a fixed batch as PI05Pytorch takes it after its processor with the loss of
PI05Pytorch.forward and the actions of PI05Pytorch.sample_actions:

  DIR/<case>/policy/            config.json + model.safetensors (save_pretrained)
  DIR/<case>/inputs.safetensors images, img_masks, tokens, masks, actions, noise, time
  DIR/<case>/expected.safetensors  loss [b, chunk, max_action_dim], actions [b, chunk, max_action_dim]
                                   (the policy's num_inference_steps), actions_2_steps (num_steps=2),
                                   prompt_labels [b, L] (random ids, -100 at some) and prefix_lm_losses
                                   [b, L]: the per-token cross entropy of PaliGemma's lm_head (tied
                                   to the embedding) on the prefix pass's outputs (0 at -100)
  DIR/done

Cases: `two_cameras` (a missing camera, prompt padding, a padded action dim) and `wide` (one
camera, other widths, 2 key/value heads).
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from safetensors.torch import save_file

from lerobot.configs.types import FeatureType, PolicyFeature
import torch.nn.functional as F

from lerobot.policies.pi05 import modeling_pi05 as m
from lerobot.policies.pi05.configuration_pi05 import PI05Config

VOCAB = 300


def shrink(vlm, expert, vision):
    """Replaces LeRobot's fixed variants and vision tower by tiny ones (head counts as LeRobot's)."""
    m.get_gemma_config = lambda variant: m.GemmaConfig(**(vlm if variant == "gemma_2b" else expert))
    paligemma, gemma_lm = m.PaliGemmaForConditionalGenerationWithPiGemma, m.PiGemmaForCausalLM

    def small_paligemma(config):
        vc = config.vision_config
        vc.hidden_size, vc.intermediate_size = vision["hidden"], vision["mlp"]
        vc.num_hidden_layers, vc.num_attention_heads, vc.patch_size = vision["layers"], 16, vision["patch"]
        vc.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = VOCAB
        return paligemma(config)

    def small_expert(config):
        config.vocab_size = VOCAB
        return gemma_lm(config)

    m.PaliGemmaForConditionalGenerationWithPiGemma = small_paligemma
    m.PiGemmaForCausalLM = small_expert
    return lambda: (setattr(m, "PaliGemmaForConditionalGenerationWithPiGemma", paligemma),
                    setattr(m, "PiGemmaForCausalLM", gemma_lm))


def make_case(out, name, seed, vlm, expert, vision, image, cams, chunk, max_action, action_dim, steps, b, L):
    restore = shrink(vlm, expert, vision)
    torch.manual_seed(seed)
    features = {f"observation.images.cam{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, image, image))
                for c in range(cams)}
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(4,))
    cfg = PI05Config(chunk_size=chunk, n_action_steps=chunk, max_action_dim=max_action, max_state_dim=8,
                     image_resolution=(image, image), num_inference_steps=steps, input_features=features,
                     output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
                     device="cpu")
    policy = m.PI05Policy(cfg)
    restore()
    with torch.no_grad():
        for pname, p in policy.named_parameters():
            layer_norm = "vision_tower" in pname and "norm" in pname and pname.endswith("weight")
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if layer_norm else 0.08 * torch.randn_like(p))
        # openpi's checkpoints tie PaliGemma's LM head to the token embedding (pi0.5 reads neither head).
        paligemma = policy.model.paligemma_with_expert.paligemma
        paligemma.lm_head.weight.copy_(paligemma.model.language_model.embed_tokens.weight)
    policy.eval()
    d = os.path.join(out, name)
    os.makedirs(d)
    policy.save_pretrained(os.path.join(d, "policy"))

    g = torch.Generator().manual_seed(seed + 1)
    images = torch.rand(cams, b, 3, image, image, generator=g) * 2 - 1
    img_masks = torch.ones(cams, b, dtype=torch.bool)
    if cams > 1:
        img_masks[cams - 1, b - 1] = False
    tokens = torch.randint(0, VOCAB, (b, L), generator=g)
    masks = torch.ones(b, L, dtype=torch.bool)
    masks[b - 1, L - 2:] = False
    actions = torch.randn(b, chunk, max_action, generator=g)
    actions[:, :, action_dim:] = 0
    noise = torch.randn(b, chunk, max_action, generator=g)
    time = torch.rand(b, generator=g) * 0.9 + 0.05
    model = policy.model
    with torch.no_grad():
        loss = model.forward(list(images), list(img_masks), tokens, masks, actions, noise, time)
        sampled = model.sample_actions(list(images), list(img_masks), tokens, masks, noise=noise)
        sampled2 = model.sample_actions(list(images), list(img_masks), tokens, masks, noise=noise, num_steps=2)
        # The prefix pass of sample_actions, its final-normed outputs through PaliGemma's lm_head.
        embs, pad, att = model.embed_prefix(list(images), list(img_masks), tokens, masks)
        mask_4d = m.prepare_attention_masks_4d(m.make_att_2d_masks(pad, att))
        model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
        (prefix_out, _), _ = model.paligemma_with_expert.forward(
            attention_mask=mask_4d, position_ids=torch.cumsum(pad, dim=1) - 1, past_key_values=None,
            inputs_embeds=[embs, None], use_cache=False)
        logits = model.paligemma_with_expert.paligemma.lm_head(prefix_out[:, -L:]).float()
        labels = torch.randint(0, VOCAB, (b, L), generator=g)
        labels[0, 0] = -100
        labels[b - 1, L - 1] = -100
        lm = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100,
                             reduction="none").view(b, L)
    save_file({"images": images.contiguous(), "img_masks": img_masks.to(torch.uint8).contiguous(), "tokens": tokens,
               "masks": masks.to(torch.uint8), "actions": actions, "noise": noise, "time": time},
              os.path.join(d, "inputs.safetensors"))
    save_file({"loss": loss.float().contiguous(), "actions": sampled.float().contiguous(),
               "actions_2_steps": sampled2.float().contiguous(), "prompt_labels": labels,
               "prefix_lm_losses": lm.contiguous()},
              os.path.join(d, "expected.safetensors"))


def make(out):
    make_case(out, "two_cameras", 3,
              vlm=dict(width=64, depth=2, mlp_dim=96, num_heads=8, num_kv_heads=1, head_dim=16),
              expert=dict(width=32, depth=2, mlp_dim=48, num_heads=8, num_kv_heads=1, head_dim=16),
              vision=dict(hidden=32, mlp=48, layers=2, patch=4), image=16, cams=2, chunk=5, max_action=6,
              action_dim=3, steps=3, b=2, L=7)
    make_case(out, "wide", 5,
              vlm=dict(width=48, depth=3, mlp_dim=64, num_heads=8, num_kv_heads=2, head_dim=8),
              expert=dict(width=40, depth=3, mlp_dim=56, num_heads=8, num_kv_heads=2, head_dim=8),
              vision=dict(hidden=48, mlp=40, layers=1, patch=8), image=24, cams=1, chunk=4, max_action=5,
              action_dim=5, steps=4, b=3, L=5)
    open(os.path.join(out, "done"), "w").close()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: pi05_oracle.py make DIR")
    make(sys.argv[2])
