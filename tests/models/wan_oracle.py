"""The Wan diffusion transformer oracle (diffusers' WanTransformer3DModel; Python as an oracle only).

`wan_oracle.py make DIR` writes tiny random models as save_pretrained writes them (t2v/, i2v/,
ti2v/), each with io.safetensors (the forward's inputs and diffusers' fp32 prediction), and
loss.safetensors: one flow-matching training step of the t2v model computed the way Wan / DiffSynth
train (sigmas linspace(1, 0, N + 1)[:-1] shifted by 5, x_t = (1 - sigma) x0 + sigma eps, target
eps - x0, per-sample MSE times the timestep weight), for given noise and timestep indices; and
loss_first_frame.safetensors: the same on the ti2v model with the first latent frame kept clean
(timestep 0 on its tokens, the frame out of the loss), as Wan 2.2 TI2V trains.
"""
import math
import os
import sys

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file


def tiny(**extra):
    cfg = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=12, in_channels=4, out_channels=4,
               text_dim=16, freq_dim=32, ffn_dim=96, num_layers=2, cross_attn_norm=True, eps=1e-6,
               rope_max_seq_len=64)
    cfg.update(extra)
    return cfg


def randomise(model, gen):
    # Every tensor away from its init (norm weights near 1, the zero-init head non-zero) so that a
    # wrong name or layout shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen) * 0.2
            p.copy_(1 + r * 0.5 if "norm" in name and name.endswith("weight") else r)


def schedule(n=1000, shift=5.0):
    sig = torch.linspace(1.0, 0.0, n + 1)[:-1]
    sig = shift * sig / (1 + (shift - 1) * sig)
    ts = sig * n
    y = torch.exp(-2 * ((ts - n / 2) / n) ** 2)
    y = y - y.min()
    w = y * (n / y.sum())
    return sig, ts, w


def make(out):
    gen = torch.Generator().manual_seed(0)
    b, f, h, w = 2, 3, 8, 6
    cases = {
        "t2v": (tiny(), 7, 0, False),
        "i2v": (tiny(image_dim=20, added_kv_proj_dim=48, cross_attn_norm=False), 512, 5, False),
        "ti2v": (tiny(), 9, 0, True),
    }
    models = {}
    for name, (cfg, text_len, image_len, per_token) in cases.items():
        torch.manual_seed(1)
        model = WanTransformer3DModel(**cfg).eval()
        randomise(model, gen)
        model.save_pretrained(os.path.join(out, name), safe_serialization=True)
        models[name] = model
        x = torch.randn(b, cfg["in_channels"], f, h, w, generator=gen)
        tokens = f * (h // 2) * (w // 2)
        if per_token:
            t = torch.rand(b, 1, generator=gen) * 1000 * torch.ones(b, tokens)
            t[:, : tokens // f] = 0  # the first frame's tokens at timestep 0 (TI2V)
        else:
            t = torch.tensor([937.5, 12.25])
        text = torch.randn(b, text_len, cfg["text_dim"], generator=gen)
        io = {"hidden_states": x, "timestep": t, "encoder_hidden_states": text}
        kw = {}
        if image_len:
            img = torch.randn(b, image_len, cfg["image_dim"], generator=gen)
            io["encoder_hidden_states_image"] = img
            kw["encoder_hidden_states_image"] = img
        with torch.no_grad():
            pred = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False, **kw)[0]
        io["prediction"] = pred.float().contiguous()
        save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out, name, "io.safetensors"))

    sig, ts, wt = schedule()
    for name, first in (("t2v", False), ("ti2v", True)):
        model = models[name]
        x0 = torch.randn(b, 4, f, h, w, generator=gen)
        noise = torch.randn(b, 4, f, h, w, generator=gen)
        ids = torch.tensor([17, 640], dtype=torch.int64)
        text = torch.randn(b, 7, 16, generator=gen)
        s = sig[ids].view(b, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        t = ts[ids]
        if first:
            xt[:, :, 0:1] = x0[:, :, 0:1]
            tokens = f * (h // 2) * (w // 2)
            mask = torch.ones(f, tokens // f)
            mask[0] = 0
            t = t.view(b, 1) * mask.reshape(1, -1)
        with torch.no_grad():
            pred = model(hidden_states=xt, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
        target = noise - x0
        err = (pred.float() - target.float()) ** 2
        if first:
            err = err[:, :, 1:]
        losses = err.reshape(b, -1).mean(1) * wt[ids]
        save_file({"latents": x0, "noise": noise, "ids": ids, "encoder_hidden_states": text, "losses": losses},
                  os.path.join(out, name, "loss_first_frame.safetensors" if first else "loss.safetensors"))
    open(os.path.join(out, "done"), "w").write("ok\n")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: wan_oracle.py make DIR")
    make(sys.argv[2])
