"""Oracle for the media tests: makes image files of every PNG/JPEG kind with Pillow and records what
transformers makes of them: the RGB array of its `convert_to_rgb` (Pillow decode, transparency
over white), Pillow's bicubic resize, and the Qwen2-VL image processor's `pixel_values` /
`image_grid_thw` (the Pillow backend, Qwen2VLImageProcessorPil: torchvision is not installed here).
Video: transformers' Qwen2VLVideoProcessor needs torchvision, so its resize + normalise + pad +
patchify steps are re-run here in numpy with the same order of operations.

usage: media_oracle.py make DIR
"""
import json
import os
import sys

import numpy as np
import PIL
from PIL import Image
from safetensors.numpy import save_file
from transformers.image_transforms import convert_to_rgb
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def smooth(rng, h, w, c):
    """Random but image-like content (gradients + noise), so resampling is exercised."""
    y, x = np.mgrid[0:h, 0:w]
    out = np.zeros((h, w, c))
    for k in range(c):
        a, b, p = rng.uniform(-3, 3, size=3)
        out[..., k] = 127 + 100 * np.sin(a * x / w * 3 + b * y / h * 3 + p)
    out += rng.normal(0, 25, size=out.shape)
    return np.clip(out, 0, 255).astype(np.uint8)


def make(d):
    # Pillow 12.3 picks the order of resize's two passes by a speed heuristic; the processors'
    # numbers below are those of the horizontal-then-vertical resize every earlier Pillow does.
    if tuple(int(x) for x in PIL.__version__.split(".")[:2]) >= (12, 3):
        sys.exit(f"media_oracle: Pillow {PIL.__version__} found, < 12.3 needed: run tools/install-deps")
    rng = np.random.default_rng(7)
    files = {}
    Image.fromarray(smooth(rng, 61, 97, 3), "RGB").save(f"{d}/rgb.png")
    files["rgb.png"] = "RGB"
    rgba = smooth(rng, 45, 33, 4)
    rgba[:5, :, 3] = 0
    rgba[5:9, :, 3] = 255
    Image.fromarray(rgba, "RGBA").save(f"{d}/rgba.png")
    Image.fromarray(smooth(rng, 30, 70, 1)[..., 0], "L").save(f"{d}/gray.png")
    g = smooth(rng, 24, 24, 1)[..., 0]
    g[3:6, 3:6] = 77
    Image.fromarray(g, "L").save(f"{d}/gray_trns.png", transparency=77)
    pal = Image.fromarray(smooth(rng, 40, 52, 3), "RGB").quantize(colors=16)
    pal.save(f"{d}/palette_trns.png", transparency=3)
    Image.fromarray(smooth(rng, 20, 36, 1)[..., 0] > 127).convert("1").save(f"{d}/bits.png")
    Image.fromarray(smooth(rng, 50, 50, 3), "RGB").save(f"{d}/interlaced.png", interlace=1)
    Image.fromarray(smooth(rng, 83, 121, 3), "RGB").save(f"{d}/photo.jpg", quality=90)
    Image.fromarray(smooth(rng, 64, 48, 3), "RGB").save(f"{d}/photo444.jpg", quality=95, subsampling=0)
    Image.fromarray(smooth(rng, 37, 29, 1)[..., 0], "L").save(f"{d}/gray.jpg", quality=85)
    Image.fromarray(smooth(rng, 600, 450, 3), "RGB").save(f"{d}/large.png")
    Image.fromarray(smooth(rng, 13, 22, 3), "RGB").save(f"{d}/tiny.png")
    names = ["rgb.png", "rgba.png", "gray.png", "gray_trns.png", "palette_trns.png", "bits.png", "interlaced.png",
             "photo.jpg", "photo444.jpg", "gray.jpg", "large.png", "tiny.png"]

    tensors = {}
    for n in names:
        rgb = convert_to_rgb(Image.open(f"{d}/{n}"), return_numpy=True)
        tensors[f"decoded/{n}"] = rgb.astype(np.float32)

    # Pillow's bicubic resize: downscales (antialiased) and upscales, non-integer ratios.
    src = Image.fromarray(convert_to_rgb(Image.open(f"{d}/large.png"), return_numpy=True))
    resizes = [[600, 450, 56, 84], [600, 450, 333, 97], [600, 450, 600, 451], [600, 450, 1000, 700],
               [600, 450, 601, 450], [600, 450, 588, 448], [600, 450, 560, 560]]
    for i, (h, w, oh, ow) in enumerate(resizes):
        tensors[f"resize/{i}"] = np.asarray(src.resize((ow, oh), Image.BICUBIC)).astype(np.float32)

    configs = {
        "default": dict(),
        "small": dict(size={"shortest_edge": 32 * 32, "longest_edge": 112 * 112}),
        "qwen3": dict(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                      size={"shortest_edge": 64 * 64, "longest_edge": 256 * 256}),
    }
    for cname, kw in configs.items():
        proc = Qwen2VLImageProcessorPil(**kw)
        for n in names:
            out = proc(images=[Image.open(f"{d}/{n}")], return_tensors="np")
            tensors[f"{cname}/{n}/pixel_values"] = out["pixel_values"].astype(np.float32)
            tensors[f"{cname}/{n}/grid"] = out["image_grid_thw"].astype(np.int64)

    # Video: 5 frames of 70 x 100, processor steps re-run in numpy (pad to 6 frames by the last).
    frames = [smooth(rng, 70, 100, 3) for _ in range(5)]
    for i, f in enumerate(frames):
        Image.fromarray(f, "RGB").save(f"{d}/frame{i}.png")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    P, T, M = 14, 2, 2
    h, w = smart_resize(70, 100, factor=P * M, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    vid = np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])  # t h w c
    vid = vid.transpose(0, 3, 1, 2).astype(np.float64) * (1 / 255)
    vid = vid.astype(np.float32)
    vid = (vid - np.array(CLIP_MEAN, np.float32)[:, None, None]) / np.array(CLIP_STD, np.float32)[:, None, None]
    vid = np.concatenate([vid, vid[-1:]], 0)
    gt, gh, gw = vid.shape[0] // T, h // P, w // P
    p = vid.reshape(gt, T, 3, gh // M, M, P, gw // M, M, P).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    tensors["video/pixel_values"] = np.ascontiguousarray(p.reshape(gt * gh * gw, 3 * T * P * P)).astype(np.float32)
    tensors["video/grid"] = np.array([[gt, gh, gw]], np.int64)

    save_file(tensors, f"{d}/expected.safetensors")
    json.dump({"images": names, "resizes": resizes, "configs": list(configs), "frames": 5}, open(f"{d}/cases.json", "w"))
    open(f"{d}/done", "w").write("ok")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])
