"""WanEncode.OfflineVaeAndUmt5ToALatentStore: tools/wan_encode.py against diffusers / transformers,
then loongforge-data diffusion on its output.

usage: .venv/bin/python tests/tools/test_wan_encode.py BUILD_BIN_DIR

Builds a tiny random AutoencoderKLWan, a tiny random UMT5EncoderModel and a WordLevel tokenizer,
writes three tiny PNG clips (5 frames, 6 frames -> truncated to 5, one image) with captions, runs
tools/wan_encode.py, and checks each latents / text file against the same computed here
(latent_dist.mode() normalised as WanVideoToVideoPipeline.prepare_latents does, the text through
WanPipeline._get_t5_prompt_embeds itself) to max-abs 1e-5. Then builds a latent store with
BUILD_BIN_DIR/loongforge-data diffusion and checks latents.json and a shard, and that a manifest line
naming a missing file makes wan_encode.py fail naming the line. Exit 0 on success, 77 (skip) when
torch / diffusers / transformers are missing, 1 on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "wan_encode.py")

try:
    import numpy as np
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from PIL import Image
    from safetensors import safe_open
    from safetensors.torch import load_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel
except ImportError as e:  # pragma: no cover
    print(f"test_wan_encode: skipped, this Python lacks a package: {e}")
    sys.exit(77)


def check(cond, msg):
    if not cond:
        print(f"FAIL: {msg}", file=sys.stderr)
        sys.exit(1)


WORDS = ["a", "red", "green", "blue", "square", "moving", "left", "right", "up", "down", "on", "black"]


def make_models(d):
    torch.manual_seed(0)
    z = 4
    vae = AutoencoderKLWan(base_dim=8, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.2, 0.3, -0.4], latents_std=[1.5, 0.5, 2.0, 0.8])
    vae.save_pretrained(os.path.join(d, "vae"))
    cfg = UMT5Config(vocab_size=len(WORDS) + 3, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=8, relative_attention_max_distance=16,
                     pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    UMT5EncoderModel(cfg).eval().save_pretrained(os.path.join(d, "text_encoder"))
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    vocab.update({w: i + 3 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(os.path.join(d, "tokenizer"))
    return z


def write_frames(d, name, n, seed):
    g = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        p = f"{name}_{k}.png"
        Image.fromarray(g.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(os.path.join(d, p))
        paths.append(p)
    return paths


def main():
    check(len(sys.argv) == 2, "usage: test_wan_encode.py BUILD_BIN_DIR")
    data_bin = os.path.join(sys.argv[1], "loongforge-data")
    check(os.access(data_bin, os.X_OK), f"no program {data_bin}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="wan_encode_") as tmp:
        z_dim = make_models(tmp)
        media = os.path.join(tmp, "media")
        os.makedirs(media)
        lines = [
            {"frames": write_frames(media, "c0", 5, 0), "caption": "a red square moving left"},
            {"frames": write_frames(media, "c1", 6, 1), "caption": "  a  blue square\tmoving up "},
            {"image": write_frames(media, "c2", 1, 2)[0], "caption": "a green square on black"},
        ]
        manifest = os.path.join(media, "x.jsonl")
        with open(manifest, "w") as f:
            f.write("".join(json.dumps(j) + "\n" for j in lines))
        out = os.path.join(tmp, "enc")
        models_args = ["--vae", os.path.join(tmp, "vae"), "--text-encoder", os.path.join(tmp, "text_encoder"),
                       "--tokenizer", os.path.join(tmp, "tokenizer")]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, TOOL, "--manifest", manifest, "--out", out] + models_args,
                           capture_output=True, text=True, env=env)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, f"wan_encode.py exited {r.returncode}")
        check("x.jsonl:2: 6 frames" in r.stderr and "truncated to 5" in r.stderr, "no note of the truncation")

        # The oracle: the models loaded here, the VAE's latents normalised as diffusers' Wan
        # pipelines do, the text through WanPipeline._get_t5_prompt_embeds.
        vae = AutoencoderKLWan.from_pretrained(os.path.join(tmp, "vae")).eval()
        te = UMT5EncoderModel.from_pretrained(os.path.join(tmp, "text_encoder")).eval()
        tk = AutoTokenizer.from_pretrained(os.path.join(tmp, "tokenizer"))
        pipe = WanPipeline(tokenizer=tk, text_encoder=te, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler())
        mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1)
        with open(os.path.join(out, "manifest.jsonl")) as f:
            got_lines = [json.loads(l) for l in f if l.strip()]
        check(len(got_lines) == 3, f"manifest.jsonl has {len(got_lines)} lines, not 3")
        expect_frames = [5, 5, 1]
        for i, j in enumerate(lines):
            g = got_lines[i]
            check(g["caption"] == j["caption"], f"sample {i}: caption {g['caption']!r}")
            names = j["frames"] if "frames" in j else [j["image"]]
            names = names[:expect_frames[i]]
            px = np.stack([np.asarray(Image.open(os.path.join(media, p)).convert("RGB")) for p in names])
            x = torch.from_numpy(px).permute(3, 0, 1, 2).float().div(127.5).sub(1.0).unsqueeze(0)
            with torch.no_grad():
                want = ((vae.encode(x).latent_dist.mode() - mean) * inv_std)[0]
                want_text = pipe._get_t5_prompt_embeds(j["caption"], max_sequence_length=512,
                                                        device=torch.device("cpu"), dtype=torch.float32)[0]
            lat = load_file(os.path.join(out, g["latents"]))["latents"]
            txt = load_file(os.path.join(out, g["text_embeddings"]))["text"]
            check(lat.dtype == torch.float32 and txt.dtype == torch.float32, f"sample {i}: not float32")
            check(tuple(lat.shape) == tuple(want.shape), f"sample {i}: latents {tuple(lat.shape)}, want {tuple(want.shape)}")
            check(lat.shape[0] == z_dim and lat.shape[1] == (expect_frames[i] - 1) // 4 + 1 and lat.shape[2:] == (2, 2),
                  f"sample {i}: latents shape {tuple(lat.shape)}")
            check(tuple(txt.shape) == (512, 16), f"sample {i}: text shape {tuple(txt.shape)}")
            dl = (lat - want).abs().max().item()
            dt = (txt - want_text).abs().max().item()
            print(f"sample {i}: latents {tuple(lat.shape)} max-abs {dl:.3g}, text max-abs {dt:.3g}")
            check(dl <= 1e-5, f"sample {i}: latents differ from diffusers by {dl}")
            check(dt <= 1e-5, f"sample {i}: text differs from WanPipeline._get_t5_prompt_embeds by {dt}")
            n_tok = len(j["caption"].split()) + 1  # words + </s>
            check(txt[n_tok:].abs().max().item() == 0 and txt[:n_tok].abs().min().item() >= 0
                  and txt[n_tok - 1].abs().max().item() > 0, f"sample {i}: text not zero past {n_tok} tokens")

        # loongforge-data diffusion on the encoder's manifest.
        store = os.path.join(tmp, "store")
        r = subprocess.run([data_bin, "diffusion", "--manifest", os.path.join(out, "manifest.jsonl"), "--out", store],
                           capture_output=True, text=True, env=env)
        print(r.stdout + r.stderr)
        check(r.returncode == 0, f"loongforge-data diffusion exited {r.returncode}")
        with open(os.path.join(store, "latents.json")) as f:
            meta = json.load(f)
        print(f"latents.json: {json.dumps(meta)}")
        check(meta["samples"] == 3, f"latents.json samples {meta['samples']}")
        check(meta["latent_channels"] == z_dim, f"latents.json latent_channels {meta['latent_channels']}")
        check(meta["text_dim"] == 16, f"latents.json text_dim {meta['text_dim']}")
        shard = os.path.join(store, meta["shards"][0]["file"])
        with safe_open(shard, "pt") as f:
            md = f.metadata() or {}
            check(md.get("0.caption") == lines[0]["caption"], f"shard caption {md.get('0.caption')!r}")
            ref = load_file(os.path.join(out, got_lines[0]["latents"]))["latents"]
            check(torch.equal(f.get_tensor("0.latents"), ref), "the store's 0.latents differ from the encoder's")

        # A manifest line naming a missing file: an error naming the line, before any model loads.
        bad = os.path.join(media, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps(lines[0]) + "\n")
            f.write(json.dumps({"frames": ["c0_0.png", "nope.png"], "caption": "a red square"}) + "\n")
        r = subprocess.run([sys.executable, TOOL, "--manifest", bad, "--out", os.path.join(tmp, "enc_bad")] + models_args,
                           capture_output=True, text=True, env=env)
        print(r.stderr)
        check(r.returncode != 0, "wan_encode.py accepted a manifest naming a missing file")
        check("bad.jsonl:2:" in r.stderr and "nope.png" in r.stderr, "the error does not name the line and the file")
    print("OK")


if __name__ == "__main__":
    main()
