"""Loads two pi05 policy directories with LeRobot 0.6's PI05Policy.from_pretrained and a strict
load of their model.safetensors (every key), and prints the largest difference of their state
dicts, or fails: the export of loongforge-convert lf2hf must load as LeRobot's own does. LeRobot
builds its fixed variants (gemma_2b, gemma_300m, SigLIP so400m); tiny test policies load under the
oracle's shrink (tests/models/pi05_oracle.py) with the sizes read off the weights' shapes.

usage: pi05_lerobot_check.py ORIGINAL EXPORTED  (EXPORTED alone: only that it loads)
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models"))
import pi05_oracle  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from lerobot.policies.pi05.modeling_pi05 import PI05Policy  # noqa: E402

LM = "model.paligemma_with_expert.paligemma.model."
EXPERT = "model.paligemma_with_expert.gemma_expert.model."


def layer(name):
    parts = name.split(".")
    return parts[parts.index("layers") + 1]


def sizes(d):
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        shape = {k: f.get_slice(k).get_shape() for k in f.keys()}

    def gemma(prefix):
        q, k = shape[prefix + "layers.0.self_attn.q_proj.weight"], shape[prefix + "layers.0.self_attn.k_proj.weight"]
        head_dim = q[0] // 8
        depth = len({layer(n) for n in shape if n.startswith(prefix + "layers.")})
        return dict(width=q[1], depth=depth, mlp_dim=shape[prefix + "layers.0.mlp.gate_proj.weight"][0], num_heads=8,
                    num_kv_heads=k[0] // head_dim, head_dim=head_dim)

    v = LM + "vision_tower.vision_model."
    patch = shape[v + "embeddings.patch_embedding.weight"]
    vision = dict(hidden=patch[0], mlp=shape[v + "encoder.layers.0.mlp.fc1.weight"][0], patch=patch[2],
                  layers=len({layer(n) for n in shape if n.startswith(v + "encoder.layers.")}))
    pi05_oracle.VOCAB = shape[LM + "language_model.embed_tokens.weight"][0]
    return gemma(LM + "language_model."), gemma(EXPERT), vision


def load(d):
    restore = pi05_oracle.shrink(*sizes(d))
    try:
        p = PI05Policy.from_pretrained(d)
    finally:
        restore()
    # from_pretrained reports load errors without failing; a strict load of the file does fail.
    missing, unexpected = p.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    return p.state_dict()


exported = load(sys.argv[-1])
if len(sys.argv) == 3:
    original = load(sys.argv[1])
    assert original.keys() == exported.keys()
    worst = max((original[k].float() - exported[k].float()).abs().max().item()
                for k in original if "gemma_expert.lm_head" not in k)
    print(f"max difference {worst:.3g}")
else:
    print(f"loaded {len(exported)} tensors")
