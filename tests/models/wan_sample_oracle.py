"""The flow-matching sampler's oracle: diffusers' FlowMatchEulerDiscreteScheduler driving a tiny
WanTransformer3DModel (Python as an oracle only).

`wan_sample_oracle.py make DIR` writes
  t2v/  a tiny random text-to-video model (wan_oracle.py's t2v configuration) as save_pretrained
        writes it, with sample.safetensors: the initial noise (torch.randn of the shape [2, 4, 3, 8, 6]
        from torch.Generator().manual_seed(1234), the noise loongforge-generate draws for --seed 1234),
        the text embeddings (`prompt`, `negative_prompt`, each [7, 16]), the scheduler's `sigmas` and
        `timesteps` (shift 5, set_timesteps(8)) and the final latents of Euler sampling as diffusers'
        Wan pipelines run it: `latents_g4` (classifier-free guidance 4: uncond + 4 (cond - uncond)),
        `latents_g1` (guidance 1: the conditional pass only) and `latents_first_frame` (guidance 4
        with the clean latent frame `first_frame` [2, 4, 1, 8, 6] kept as the first frame, its tokens
        at timestep 0, as WanImageToVideoPipeline with expand_timesteps (Wan 2.2 TI2V) does), and
        text.safetensors: `prompt` and `negative_prompt` alone (loongforge-generate
        --text-embeddings); and `latents_two_experts`: Wan 2.2 A14B's two noise experts as WanPipeline
        with boundary_ratio 0.8 joins them (this model at timesteps >= 800 with guidance 4, the
        low-noise expert t2v_low/ below it with guidance 2);
  t2v_low/  a second random model of the same configuration (the low-noise expert);
  rgb/  a tiny random model with 3 latent channels (the demo's pixel latent space).
A separate script from wan_oracle.py so that its cache stays valid.
"""
import os
import sys

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
from safetensors.torch import save_file


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_oracle import randomise, tiny  # noqa: E402  (the same tiny configuration and weights draw)


def sample(model, noise, cond, uncond, g, steps=8, shift=5.0, first_frame=None, low=None, boundary_ratio=None, g2=None):
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    sched.set_timesteps(steps)
    b = noise.shape[0]
    latents = noise.clone()
    cond = cond.unsqueeze(0).expand(b, -1, -1)
    uncond = uncond.unsqueeze(0).expand(b, -1, -1)
    mask = None
    if first_frame is not None:
        mask = torch.ones(1, 1, *noise.shape[2:])
        mask[:, :, 0] = 0
    boundary = boundary_ratio * sched.config.num_train_timesteps if boundary_ratio is not None else None
    for t in sched.timesteps:
        # Wan 2.2 A14B (WanPipeline with boundary_ratio): the high-noise expert down to the boundary.
        current, cg = (model, g) if boundary is None or t >= boundary else (low, g2)
        if mask is not None:
            x = (1 - mask) * first_frame + mask * latents
            timestep = (mask[0][0][:, ::2, ::2] * t).flatten().unsqueeze(0).expand(b, -1)
        else:
            x = latents
            timestep = t.expand(b)
        with torch.no_grad():
            v = current(hidden_states=x, timestep=timestep, encoder_hidden_states=cond, return_dict=False)[0]
            if cg > 1:
                vu = current(hidden_states=x, timestep=timestep, encoder_hidden_states=uncond, return_dict=False)[0]
                v = vu + cg * (v - vu)
        latents = sched.step(v, t, latents, return_dict=False)[0]
    if mask is not None:
        latents = (1 - mask) * first_frame + mask * latents
    return latents, sched


def make(out):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(1)
    model = WanTransformer3DModel(**tiny()).eval()
    randomise(model, gen)
    model.save_pretrained(os.path.join(out, "t2v"), safe_serialization=True)
    noise = torch.randn((2, 4, 3, 8, 6), generator=torch.Generator().manual_seed(1234))
    prompt = torch.randn(7, 16, generator=gen)
    negative = torch.randn(7, 16, generator=gen)
    first = torch.randn(2, 4, 1, 8, 6, generator=gen)
    g4, sched = sample(model, noise, prompt, negative, 4.0)
    g1, _ = sample(model, noise, prompt, negative, 1.0)
    ff, _ = sample(model, noise, prompt, negative, 4.0, first_frame=first)
    torch.manual_seed(3)
    low = WanTransformer3DModel(**tiny()).eval()
    randomise(low, gen)
    low.save_pretrained(os.path.join(out, "t2v_low"), safe_serialization=True)
    two, _ = sample(model, noise, prompt, negative, 4.0, low=low, boundary_ratio=0.8, g2=2.0)
    save_file({"noise": noise, "prompt": prompt, "negative_prompt": negative, "first_frame": first,
               "sigmas": sched.sigmas.float().contiguous(), "timesteps": sched.timesteps.float().contiguous(),
               "latents_g4": g4.float().contiguous(), "latents_g1": g1.float().contiguous(),
               "latents_first_frame": ff.float().contiguous(), "latents_two_experts": two.float().contiguous()},
              os.path.join(out, "t2v", "sample.safetensors"))
    save_file({"prompt": prompt, "negative_prompt": negative}, os.path.join(out, "t2v", "text.safetensors"))

    torch.manual_seed(2)
    rgb = WanTransformer3DModel(**tiny(in_channels=3, out_channels=3)).eval()
    randomise(rgb, gen)
    rgb.save_pretrained(os.path.join(out, "rgb"), safe_serialization=True)
    open(os.path.join(out, "done"), "w").write("ok\n")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: wan_sample_oracle.py make DIR")
    make(sys.argv[2])
