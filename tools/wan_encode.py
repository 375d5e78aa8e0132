#!/bin/sh
''':'
# Re-run this file under the repo's Python (torch, diffusers and transformers live there); see the docstring.
here=$(dirname "$0")
py=${LOONGFORGE_PYTHON:-$here/../.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" "$0" "$@"
'''
"""tools/wan_encode.py: the offline encoder of Wan latent stores (a data-preparation tool; nothing
in the trainer imports it).

Reads a JSONL manifest, one sample a line:
  {"video": "a.mp4" | "frames": ["f0.png", ...] | "image": "x.png", "caption": "...",
   "image_embeddings": "c.safetensors" (optional, passed through)}
(paths relative to the manifest's directory), encodes each clip with diffusers' AutoencoderKLWan
and each caption with a UMT5 text encoder as diffusers' WanPipeline does, and writes

  OUT/latents/<i>.safetensors   tensor "latents" [C, F', H', W'] float32 (normalised, see below)
  OUT/text/<i>.safetensors      tensor "text" [L, D] float32 (L = --max-sequence-length, zero rows
                                past the prompt's tokens)
  OUT/manifest.jsonl            {"caption", "latents", "text_embeddings"[, "image_embeddings"]}
                                for `loongforge-data diffusion --manifest OUT/manifest.jsonl --out STORE`

usage:
  tools/wan_encode.py --manifest x.jsonl --out DIR --vae WAN/vae --text-encoder WAN/text_encoder \
      --tokenizer WAN/tokenizer [--height H --width W] [--max-sequence-length 512] \
      [--device cpu|cuda] [--dtype fp32|bf16]

Pixels: RGB, resized (Pillow, bicubic) to --height x --width when given, scaled to [-1, 1], a clip
[1, 3, F, H, W]. The VAE needs F = 4k + 1 frames (its temporal factor k = 4 for Wan): longer clips
are truncated to the largest such count, with a note on stderr. H and W must be multiples of the
VAE's spatial factor (8). Latents: the mean of the latent distribution (`latent_dist.mode()`),
normalised as diffusers' Wan pipelines do.
Videos are decoded with torchvision if installed, else PyAV, else refused (frames and images
always work, through Pillow).
"""
import argparse
import json
import os
import sys


def fail(msg):
    print(f"wan_encode.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


class LineError(Exception):
    pass


def video_backend():
    try:
        import torchvision.io  # noqa: F401
        return "torchvision"
    except Exception:
        pass
    try:
        import av  # noqa: F401
        return "av"
    except Exception:
        return None


def decode_video(path, backend):
    """RGB frames of a video file as a list of PIL images."""
    from PIL import Image
    if backend == "torchvision":
        import torchvision.io
        frames, _, _ = torchvision.io.read_video(path, pts_unit="sec", output_format="THWC")
        return [Image.fromarray(f.numpy()) for f in frames]
    import av
    with av.open(path) as c:
        return [f.to_image().convert("RGB") for f in c.decode(video=0)]


def read_manifest(path, backend):
    """The manifest's lines, checked before any model is loaded: [(where, line dict, media paths)]."""
    root = os.path.dirname(os.path.abspath(path))
    resolve = lambda p: p if os.path.isabs(p) else os.path.join(root, p)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        fail(f"cannot read the manifest {path}: {e}")
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            j = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{where}: not a JSON object: {e}")
        if not isinstance(j, dict):
            fail(f"{where}: not a JSON object")
        caption = j.get("caption")
        if not isinstance(caption, str) or not caption.strip():
            fail(f"{where}: no caption (a non-empty string)")
        if "video" in j:
            if backend is None:
                fail(f"{where}: \"video\" needs torchvision or PyAV in this Python ({sys.executable}), "
                     "neither is installed; give the clip as \"frames\" (a list of images) instead")
            media = ("video", [resolve(j["video"])])
        elif "frames" in j:
            if not isinstance(j["frames"], list) or not j["frames"]:
                fail(f"{where}: \"frames\" must be a non-empty list of image paths")
            media = ("frames", [resolve(f) for f in j["frames"]])
        elif "image" in j:
            media = ("image", [resolve(j["image"])])
        else:
            fail(f"{where}: a line names \"video\", \"frames\" or \"image\"")
        for p in media[1]:
            if not os.path.isfile(p):
                fail(f"{where}: no such file {p}")
        if "image_embeddings" in j:
            p = resolve(j["image_embeddings"])
            if not os.path.isfile(p):
                fail(f"{where}: no such file {p}")
            j["image_embeddings"] = p
        out.append((where, j, media))
    if not out:
        fail(f"{path}: no samples")
    return out


def load_pixels(where, media, backend, height, width, t_factor, s_factor):
    """[1, 3, F, H, W] float32 in [-1, 1], F = t_factor * k + 1."""
    import numpy as np
    import torch
    from PIL import Image
    kind, paths = media
    try:
        if kind == "video":
            frames = decode_video(paths[0], backend)
        else:
            frames = [Image.open(p).convert("RGB") for p in paths]
    except Exception as e:
        raise LineError(f"cannot decode {kind}: {e}")
    if not frames:
        raise LineError(f"{kind}: no frames")
    n = len(frames)
    keep = (n - 1) // t_factor * t_factor + 1
    if keep != n:
        print(f"{where}: {n} frames, the VAE takes {t_factor}k + 1: truncated to {keep}", file=sys.stderr)
        frames = frames[:keep]
    if height or width:
        h = height or frames[0].height
        w = width or frames[0].width
        frames = [f.resize((w, h), Image.BICUBIC) if f.size != (w, h) else f for f in frames]
    w0, h0 = frames[0].size
    for k, f in enumerate(frames):
        if f.size != (w0, h0):
            raise LineError(f"frame {k} is {f.size[0]}x{f.size[1]}, frame 0 is {w0}x{h0} (give --height/--width)")
    if h0 % s_factor or w0 % s_factor:
        raise LineError(f"{w0}x{h0} pixels: width and height must be multiples of {s_factor} "
                        "(the VAE's spatial factor; give --height/--width)")
    x = torch.from_numpy(np.stack([np.asarray(f, dtype=np.uint8) for f in frames]))  # [F, H, W, 3]
    x = x.permute(3, 0, 1, 2).float().div(127.5).sub(1.0)  # [3, F, H, W] in [-1, 1]
    return x.unsqueeze(0).contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True, help="JSONL of video / frames / image + caption")
    ap.add_argument("--out", required=True, help="output directory (latents/, text/, manifest.jsonl)")
    ap.add_argument("--vae", required=True, help="AutoencoderKLWan directory (a Wan pipeline's vae/)")
    ap.add_argument("--text-encoder", required=True, help="UMT5EncoderModel directory (text_encoder/)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer directory (tokenizer/)")
    ap.add_argument("--height", type=int, default=0, help="resize frames to this height (default: kept)")
    ap.add_argument("--width", type=int, default=0, help="resize frames to this width (default: kept)")
    ap.add_argument("--max-sequence-length", type=int, default=512,
                    help="text tokens, padded / truncated to (WanPipeline's default 512)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="compute dtype of the VAE and the text encoder (outputs are float32)")
    a = ap.parse_args()
    if a.height < 0 or a.width < 0 or a.max_sequence_length < 1:
        fail("--height/--width must be >= 0 and --max-sequence-length >= 1")

    backend = video_backend()
    samples = read_manifest(a.manifest, backend)

    import torch
    from safetensors.torch import save_file
    from diffusers import AutoencoderKLWan
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
    from transformers import AutoTokenizer, UMT5EncoderModel

    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device here")
    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    try:
        vae = AutoencoderKLWan.from_pretrained(a.vae, torch_dtype=dtype).to(device).eval()
    except Exception as e:
        fail(f"--vae {a.vae}: cannot load an AutoencoderKLWan: {e}")
    try:
        text_encoder = UMT5EncoderModel.from_pretrained(a.text_encoder, torch_dtype=dtype).to(device).eval()
    except Exception as e:
        fail(f"--text-encoder {a.text_encoder}: cannot load a UMT5EncoderModel: {e}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)
    except Exception as e:
        fail(f"--tokenizer {a.tokenizer}: cannot load a tokenizer: {e}")

    cfg = vae.config
    t_factor = 2 ** sum(bool(t) for t in cfg.temperal_downsample)          # 4 for Wan
    s_factor = 2 ** (len(cfg.dim_mult) - 1) * (cfg.patch_size or 1)          # 8 (Wan 2.1), 16 (2.2)
    # The normalisation of diffusers' Wan pipelines (diffusers 0.42,
    # pipelines/wan/pipeline_wan_video2video.py, WanVideoToVideoPipeline.prepare_latents):
    #   latents_mean = tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1)
    #   latents_std = 1.0 / tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1)
    #   init_latents = (init_latents - latents_mean) * latents_std
    # where init_latents = retrieve_latents(vae.encode(video), sample_mode="argmax") = latent_dist.mode();
    # WanPipeline.__call__ inverts it before decoding: latents / latents_std + latents_mean.
    latents_mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(device, dtype)
    latents_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(device, dtype)
    L = a.max_sequence_length

    os.makedirs(os.path.join(a.out, "latents"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "text"), exist_ok=True)
    lines = []
    for i, (where, j, media) in enumerate(samples):
        try:
            x = load_pixels(where, media, backend, a.height, a.width, t_factor, s_factor)
            with torch.no_grad():
                z = vae.encode(x.to(device, dtype)).latent_dist.mode()
                z = (z - latents_mean) * latents_std
                # The text as WanPipeline._get_t5_prompt_embeds encodes it (pipelines/wan/pipeline_wan.py):
                # prompt_clean, padding="max_length" to max_sequence_length, truncation, special
                # tokens, the encoder run with the attention mask, the rows past the prompt's
                # tokens set to zero.
                t = tokenizer([prompt_clean(j["caption"])], padding="max_length", max_length=L, truncation=True,
                              add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
                ids, mask = t.input_ids, t.attention_mask
                n = int(mask.gt(0).sum(dim=1)[0])
                e = text_encoder(ids.to(device), mask.to(device)).last_hidden_state[0]
                e = torch.cat([e[:n], e.new_zeros(L - n, e.size(1))])
        except LineError as err:
            fail(f"{where}: {err}")
        except Exception as err:
            fail(f"{where}: {type(err).__name__}: {err}")
        lat_rel = f"latents/{i}.safetensors"
        txt_rel = f"text/{i}.safetensors"
        save_file({"latents": z[0].float().cpu().contiguous()}, os.path.join(a.out, lat_rel))
        save_file({"text": e.float().cpu().contiguous()}, os.path.join(a.out, txt_rel))
        out = {"caption": j["caption"], "latents": lat_rel, "text_embeddings": txt_rel}
        if "image_embeddings" in j:
            out["image_embeddings"] = j["image_embeddings"]
        lines.append(json.dumps(out, ensure_ascii=False))
        print(f"{where}: latents {list(z.shape[1:])}, text [{L}, {e.size(1)}] ({n} tokens)", file=sys.stderr)
    tmp = os.path.join(a.out, "manifest.jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(a.out, "manifest.jsonl"))
    print(f"wrote {len(lines)} samples to {a.out} "
          f"(loongforge-data diffusion --manifest {os.path.join(a.out, 'manifest.jsonl')} --out STORE)")


if __name__ == "__main__":
    main()
