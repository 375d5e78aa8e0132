"""The LeRobot reference that tools/bench --pi05 times LoongForge's pi05 composite against.

LeRobot needs Python 3.12, so this runs in .venv-lerobot (tools/bench_reference.py runs in .venv):

  .venv-lerobot/bin/python tools/bench_lerobot.py train-lerobot-pi05 --config-json JSON --steps N --warmup W

JSON is {model, training, optimizer} of the bench config resolved by loongforge-train --dry-run.
It builds LeRobot 0.6's PI05Policy of the same sizes offline (LeRobot's fixed gemma variants and
SigLIP tower replaced by the config's, as tests/models/pi05_oracle.py's shrink() does; LeRobot's code
is not changed), fp32, no torch.compile, no gradient checkpointing (LeRobot's defaults), and times
training steps the way lerobot-train runs PI05Policy.forward: a fresh mock batch of the shapes
LoongForge's --mock-data gives (cameras x [b, 3, H, W] in [-1, 1] with a missing camera now and
then, prompt tokens with padding, action chunks zero-padded to max_action_dim), noise and time from
PI05Pytorch.sample_noise / sample_time, PI05Pytorch.forward -> the loss over the real action dims
.mean() -> backward -> clip_grad_norm_ -> AdamW.step (fused=True: ATen's one-pass CPU kernel, the
fastest torch.optim.AdamW on the CPU; lerobot-train's default builds the per-tensor loop) ->
zero_grad. Threads come from OMP_NUM_THREADS (set by tools/bench). Prints one JSON line on stdout:
wall-clock samples/s and the process's CPU time (user + system of every thread, time.process_time)
per sample over the steps after --warmup, peak RSS being the caller's to take (wait4).
"""
import argparse
import json
import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def build_policy(m, cfg):
    """LeRobot's PI05Policy with the config's SigLIP, PaliGemma LM and action expert sizes."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    model = cfg["model"]
    v, lm, ex = model["vision_encoder"], model["foundation"], model["action_expert"]
    gemma = {k: lm[k] for k in ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")}
    expert = {k: ex[k] for k in ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")}
    get_config, paligemma, gemma_lm = (m.get_gemma_config, m.PaliGemmaForConditionalGenerationWithPiGemma,
                                       m.PiGemmaForCausalLM)
    m.get_gemma_config = lambda variant: m.GemmaConfig(**(gemma if variant == "gemma_2b" else expert))

    def small_paligemma(config):
        vc = config.vision_config
        vc.hidden_size, vc.intermediate_size = v["hidden_size"], v["intermediate_size"]
        vc.num_hidden_layers, vc.num_attention_heads = v["num_hidden_layers"], v["num_attention_heads"]
        vc.patch_size, vc.layer_norm_eps = v["patch_size"], float(v["layer_norm_eps"])
        vc.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = lm["vocab_size"]
        config.text_config.rms_norm_eps = float(lm["rms_norm_eps"])
        return paligemma(config)

    def small_expert(config):
        config.vocab_size = lm["vocab_size"]
        config.rms_norm_eps = float(ex["rms_norm_eps"])
        return gemma_lm(config)

    m.PaliGemmaForConditionalGenerationWithPiGemma = small_paligemma
    m.PiGemmaForCausalLM = small_expert
    try:
        s = v["image_size"]
        features = {f"observation.images.cam{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, s, s))
                    for c in range(model["mock_cameras"])}
        features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(model["action_dim"],))
        pc = PI05Config(chunk_size=model["chunk_size"], n_action_steps=model["chunk_size"],
                        max_action_dim=model["max_action_dim"], max_state_dim=model["max_action_dim"],
                        image_resolution=(s, s), num_inference_steps=model["num_inference_steps"],
                        time_sampling_beta_alpha=float(model["time_sampling_beta_alpha"]),
                        time_sampling_beta_beta=float(model["time_sampling_beta_beta"]),
                        time_sampling_scale=float(model["time_sampling_scale"]),
                        time_sampling_offset=float(model["time_sampling_offset"]),
                        min_period=float(model["min_period"]), max_period=float(model["max_period"]),
                        input_features=features, dtype="float32", gradient_checkpointing=False,
                        compile_model=False,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION,
                                                                 shape=(model["action_dim"],))},
                        device="cpu")
        return m.PI05Policy(pc)
    finally:
        m.get_gemma_config = get_config
        m.PaliGemmaForConditionalGenerationWithPiGemma, m.PiGemmaForCausalLM = paligemma, gemma_lm


def mock_batch(model, vocab, b, gen):
    """The batch shape LoongForge's pi05 --mock-data gives (src/models/composites/pi05_plan.cpp)."""
    cams, n, s = model["mock_cameras"], model["mock_tokens"], model["vision_encoder"]["image_size"]
    chunk, amax, adim = model["chunk_size"], model["max_action_dim"], model["action_dim"]
    images = [torch.rand(b, 3, s, s, generator=gen) * 2 - 1 for _ in range(cams)]
    img_masks = [torch.ones(b, dtype=torch.bool) for _ in range(cams)]
    tokens = torch.randint(0, vocab, (b, n), generator=gen)
    masks = torch.ones(b, n, dtype=torch.bool)
    for i in range(b):
        if cams > 1 and i % 4 == 3:
            img_masks[cams - 1][i] = False
        pad = i % max(1, n // 2)
        if pad:
            masks[i, n - pad:] = False
    actions = torch.zeros(b, chunk, amax)
    actions[:, :, :adim] = torch.randn(b, chunk, adim, generator=gen)
    return images, img_masks, tokens, masks, actions


def train_lerobot_pi05(args):
    cfg = json.loads(args.config_json)
    model_cfg, t = cfg["model"], cfg["training"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(t.get("seed", 1234))
    from lerobot.policies.pi05 import modeling_pi05 as m
    baseline_kib = vm_kib("VmRSS")  # the interpreter, torch and LeRobot, before the model
    policy = build_policy(m, cfg)
    policy.train()
    pi05 = policy.model
    params = [p for p in policy.get_optim_params() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]), eps=o["adam_eps"],
                            weight_decay=o["weight_decay"], fused=True)
    b = t["micro_batch_size"]
    assert t["global_batch_size"] == b, "the bench runs one micro-batch per step"
    vocab, adim = model_cfg["foundation"]["vocab_size"], model_cfg["action_dim"]
    gen = torch.Generator().manual_seed(t.get("seed", 1234) + 1)
    times, cpu, losses = [], [], []
    for _ in range(args.steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        images, img_masks, tokens, masks, actions = mock_batch(model_cfg, vocab, b, gen)
        noise = pi05.sample_noise(actions.shape, actions.device)
        tm = pi05.sample_time(b, actions.device)
        loss = pi05.forward(images, img_masks, tokens, masks, actions, noise, tm)[:, :, :adim].mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["clip_grad"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    timed, timed_cpu = times[args.warmup:], cpu[args.warmup:]
    prefix = model_cfg["mock_cameras"] * (model_cfg["vision_encoder"]["image_size"] //
                                          model_cfg["vision_encoder"]["patch_size"]) ** 2 + model_cfg["mock_tokens"]
    tokens_per_sample = prefix + model_cfg["chunk_size"]
    pg = pi05.paligemma_with_expert.paligemma
    print(json.dumps({
        "samples_per_sec": b * len(timed) / sum(timed), "steps_per_sec": len(timed) / sum(timed),
        "tokens_per_sec": b * tokens_per_sample * len(timed) / sum(timed), "step_seconds": timed,
        "samples_per_cpu_second": b * len(timed_cpu) / sum(timed_cpu), "step_cpu_seconds": timed_cpu,
        "losses": losses, "parameters": sum(p.numel() for p in params), "baseline_rss_kib": baseline_kib,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "vision_attention": pg.config.vision_config._attn_implementation,
        "lm_attention": "eager (modeling_pi05.compute_layer_complete)"}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tp = sub.add_parser("train-lerobot-pi05")
    tp.add_argument("--config-json", required=True,
                    help="resolved {model, training, optimizer} from loongforge-train --dry-run")
    tp.add_argument("--steps", type=int, required=True)
    tp.add_argument("--warmup", type=int, required=True)
    args = ap.parse_args()
    {"train-lerobot-pi05": train_lerobot_pi05}[args.cmd](args)


if __name__ == "__main__":
    main()
