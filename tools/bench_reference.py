"""The PyTorch eager reference that tools/bench times LoongForge against.

It is the decoder of src/models/foundations/decoder.cpp written plainly in eager PyTorch (same
[s, b, h] layout, F.rms_norm, RoPE on non-interleaved halves, GQA with Megatron's per-group fused
QKV and SDPA with enable_gqa, SwiGLU with fc1 = [gate; up], tied embeddings) trained with AdamW
(fused=True: ATen's one-pass CPU kernel, 2-5x faster here than foreach=True, which on the CPU
loops over the tensors op by op), gradient clipping and, for bf16, Megatron-style mixed precision (bf16 weights, fp32 main grads and master weights), as
LoongForge does. It is a benchmark oracle, not a runtime: nothing in LoongForge imports it.

  bench_reference.py train --config-json JSON --steps N --warmup W [--bf16] [--compile]
  bench_reference.py peak --dtype fp32|bf16     # the matmul peak MFU is measured against
  bench_reference.py train-hf-moe --config-json JSON --steps N --warmup W --experts eager|grouped_mm
      # the MoE reference: HF transformers' Qwen3MoeForCausalLM (sdpa attention, its experts
      # implementation `eager` (a loop over the hit experts) or `grouped_mm` (torch's grouped GEMM),
      # router aux loss on when the config has one), trained the same way

  bench_reference.py train-hf-vlm --config-json JSON --steps N --warmup W --attn sdpa|eager
      # the VLM reference: HF transformers' Qwen2_5_VLForConditionalGeneration (vision tower and
      # language model with that attention implementation) on the batch shape --mock-data gives
      # LoongForge: per sample one random image of mock_image_patches^2 patches whose merged
      # placeholders start the sequence, random text after; the placeholders are not predicted

All print one JSON line on stdout. Threads come from OMP_NUM_THREADS (set by tools/bench).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


class Decoder(torch.nn.Module):
    def __init__(self, c, dtype):
        super().__init__()
        h, f = c["hidden_size"], c["ffn_hidden_size"]
        nq = c["num_attention_heads"]
        nkv = c["num_query_groups"] or nq
        d = c["kv_channels"] or h // nq
        mult = c["make_vocab_size_divisible_by"]
        v = (c["vocab_size"] + mult - 1) // mult * mult
        self.c, self.h, self.nq, self.nkv, self.d, self.f = c, h, nq, nkv, d, f
        std = float(c["init_method_std"])
        out_std = std / math.sqrt(2.0 * c["num_layers"])

        def param(shape, s):
            t = torch.randn(shape) * s if s else torch.ones(shape)
            return torch.nn.Parameter(t.to(dtype))

        self.embedding = param((v, h), std)
        self.layers = torch.nn.ModuleList()
        for _ in range(c["num_layers"]):
            layer = torch.nn.Module()
            layer.input_norm = param((h,), 0)
            layer.qkv = param(((nq + 2 * nkv) * d, h), std)
            layer.proj = param((h, nq * d), out_std)
            layer.pre_mlp_norm = param((h,), 0)
            layer.fc1 = param((2 * f, h), std)
            layer.fc2 = param((h, f), out_std)
            self.layers.append(layer)
        self.final_norm = param((h,), 0)
        assert not c["untie_embeddings_and_output_weights"], "the bench configs tie embeddings"

    def rope_tables(self, s, device):
        inv_freq = float(self.c["rotary_base"]) ** (
            -torch.arange(0, self.d, 2, dtype=torch.float64) / self.d)
        angles = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)  # [s, d/2]
        emb = torch.cat([angles, angles], -1)[:, None, None, :]  # [s, 1, 1, d]
        return emb.cos().float().to(device), emb.sin().float().to(device)

    @staticmethod
    def rope(x, cos, sin):  # x: [s, b, n, d]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    def attention(self, layer, x, cos, sin):  # x: [s, b, h]
        s, b, _ = x.shape
        per_group = self.nq // self.nkv
        qkv = F.linear(x, layer.qkv).view(s, b, self.nkv, per_group + 2, self.d)
        q = self.rope(qkv[:, :, :, :per_group].reshape(s, b, self.nq, self.d), cos, sin)
        k = self.rope(qkv[:, :, :, per_group], cos, sin)
        v = qkv[:, :, :, per_group + 1]
        # [s, b, n, d] -> [b, n, s, d]
        o = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3),
                                           v.permute(1, 2, 0, 3), is_causal=True,
                                           enable_gqa=True)
        o = o.permute(2, 0, 1, 3).reshape(s, b, self.nq * self.d)
        return F.linear(o, layer.proj)

    def mlp(self, layer, x):
        gate, up = F.linear(x, layer.fc1).chunk(2, -1)
        return F.linear(F.silu(gate) * up, layer.fc2)

    def loss(self, tokens, labels):  # tokens, labels: [b, s]
        s = tokens.shape[1]
        cos, sin = self.rope_tables(s, tokens.device)
        eps = float(self.c["norm_epsilon"])  # PyYAML reads 1e-05 as a string
        x = F.embedding(tokens.t(), self.embedding)  # [s, b, h]
        for layer in self.layers:
            x = x + self.attention(layer, F.rms_norm(x, (self.h,), layer.input_norm, eps), cos, sin)
            x = x + self.mlp(layer, F.rms_norm(x, (self.h,), layer.pre_mlp_norm, eps))
        x = F.rms_norm(x, (self.h,), self.final_norm, eps)
        logits = F.linear(x, self.embedding)[..., : self.c["vocab_size"]]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                               labels.t().reshape(-1))


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def train(args):
    cfg = json.loads(args.config_json)
    c, t = cfg["model"], cfg["training"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    torch.manual_seed(t.get("seed", 1234))
    baseline_kib = vm_kib("VmRSS")  # the interpreter and torch, before the model exists
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    device = torch.device(args.device)
    model = Decoder(c, dtype).to(device)
    params = list(model.parameters())
    # Megatron-style mixed precision: fp32 masters own the optimizer state; bf16 weights compute.
    masters = params if not args.bf16 else [p.detach().float().requires_grad_() for p in params]
    decay = [m for m in masters if m.dim() > 1]
    no_decay = [m for m in masters if m.dim() <= 1]  # the norm weights, as in LoongForge
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]),
                            eps=o["adam_eps"], fused=True)
    loss_fn = model.loss
    if args.compile:
        # Inductor on the CPU: forward and backward compiled (AOTAutograd) on the first call; the
        # cache lives where tools/bench puts TORCHINDUCTOR_CACHE_DIR (build/).
        loss_fn = torch.compile(model.loss)
    b, s = t["micro_batch_size"], t["seq_length"]
    assert t["global_batch_size"] == b, "the bench runs one micro-batch per step"
    vocab = c["vocab_size"]
    times, losses = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        data = torch.randint(0, vocab, (b, s + 1)).to(device)  # mock data, as --mock-data
        loss = loss_fn(data[:, :-1], data[:, 1:])
        loss.backward()
        if args.bf16:
            for m, p in zip(masters, params):
                m.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(masters, o["clip_grad"], foreach=True)
        opt.step()
        if args.bf16:
            with torch.no_grad():
                torch._foreach_copy_(params, masters)
        for p in params:
            p.grad = None
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # also waits for the device
        times.append(time.perf_counter() - start)
    timed = times[args.warmup:]
    steady = sorted(timed)[len(timed) // 2]
    print(json.dumps({"tokens_per_sec": b * s * len(timed) / sum(timed),
                      # the first step's time beyond a steady step's: compilation (with --compile)
                      "first_step_extra_seconds": times[0] - steady,
                      "step_seconds": timed, "losses": losses,
                      "parameters": sum(p.numel() for p in params),
                      "baseline_rss_kib": baseline_kib, "threads": torch.get_num_threads(),
                      "device_peak_mib": (torch.cuda.max_memory_allocated() / 2**20
                                          if device.type == "cuda" else None)}))


def moe_layers(freq, layers):
    """moe_layer_freq ("N" or a list expression such as ([0]*1+[1]*3)) -> 0/1 per layer."""
    text = str(freq).strip()
    if text.isdigit():
        return [1 if i % int(text) == 0 else 0 for i in range(layers)]
    pattern = eval(text, {"__builtins__": {}})  # a list expression of 0/1, as Megatron reads it
    assert len(pattern) == layers, (text, layers)
    return list(pattern)


def hf_steps(model, params, opt, c, t, o, args, device):
    """The HF references' training loop: one micro-batch of random tokens per step, HF's own loss
    (it shifts the labels itself: s tokens in, s - 1 predictions), clipping, AdamW. Step seconds
    and losses."""
    b, s = t["micro_batch_size"], t["seq_length"]
    assert t["global_batch_size"] == b, "the bench runs one micro-batch per step"
    times, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        data = torch.randint(0, c["vocab_size"], (b, s + 1)).to(device)
        out = model(input_ids=data[:, :-1], labels=data[:, :-1], use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["clip_grad"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        times.append(time.perf_counter() - start)
    return times, losses


def train_hf_moe(args):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = json.loads(args.config_json)
    c, t = cfg["model"], cfg["training"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    torch.manual_seed(t.get("seed", 1234))
    baseline_kib = vm_kib("VmRSS")
    nq = c["num_attention_heads"]
    pattern = moe_layers(c["moe_layer_freq"], c["num_layers"])
    coeff = float(c["moe_aux_loss_coeff"]) if c["moe_router_load_balancing_type"] != "none" else 0.0
    hc = Qwen3MoeConfig(
        hidden_size=c["hidden_size"], intermediate_size=c["ffn_hidden_size"],
        moe_intermediate_size=c["moe_ffn_hidden_size"] or c["ffn_hidden_size"],
        num_hidden_layers=c["num_layers"], num_attention_heads=nq,
        num_key_value_heads=c["num_query_groups"] or nq,
        head_dim=c["kv_channels"] or c["hidden_size"] // nq, vocab_size=c["vocab_size"],
        max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=float(c["norm_epsilon"]),
        rope_theta=float(c["rotary_base"]), num_experts=c["num_experts"],
        num_experts_per_tok=c["moe_router_topk"], norm_topk_prob=not c["moe_router_pre_softmax"],
        decoder_sparse_step=1, mlp_only_layers=[i for i, m in enumerate(pattern) if not m],
        tie_word_embeddings=not c["untie_embeddings_and_output_weights"],
        output_router_logits=coeff > 0, router_aux_loss_coef=coeff)
    hc._experts_implementation = args.experts
    hc._attn_implementation = "sdpa"
    device = torch.device(args.device)
    model = Qwen3MoeForCausalLM(hc).to(device).train()
    params = list(model.parameters())
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]),
                            eps=o["adam_eps"], fused=True)
    b, s = t["micro_batch_size"], t["seq_length"]
    times, losses = hf_steps(model, params, opt, c, t, o, args, device)
    timed = times[args.warmup:]
    print(json.dumps({"tokens_per_sec": b * s * len(timed) / sum(timed), "step_seconds": timed,
                      "losses": losses, "parameters": sum(p.numel() for p in params),
                      "baseline_rss_kib": baseline_kib, "threads": torch.get_num_threads(),
                      "experts_implementation": args.experts}))


def train_hf_lora(args):
    """HF transformers' LlamaForCausalLM with PEFT LoRA adapters (the base frozen), the same shapes
    and optimizer as the LoongForge run; one micro-batch per step."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = json.loads(args.config_json)
    c, t = cfg["model"], cfg["training"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    torch.manual_seed(t.get("seed", 1234))
    baseline_kib = vm_kib("VmRSS")
    nq = c["num_attention_heads"]
    hc = LlamaConfig(hidden_size=c["hidden_size"], intermediate_size=c["ffn_hidden_size"],
                     num_hidden_layers=c["num_layers"], num_attention_heads=nq,
                     num_key_value_heads=c["num_query_groups"] or nq,
                     head_dim=c["kv_channels"] or c["hidden_size"] // nq, vocab_size=c["vocab_size"],
                     max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=float(c["norm_epsilon"]),
                     rope_theta=float(c["rotary_base"]),
                     tie_word_embeddings=not c["untie_embeddings_and_output_weights"])
    hc._attn_implementation = "sdpa"
    device = torch.device(args.device)
    model = LlamaForCausalLM(hc).to(device)
    targets = args.targets.split(",")
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                             target_modules=targets if targets != ["all-linear"] else "all-linear",
                                             task_type="CAUSAL_LM")).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]), eps=o["adam_eps"],
                            weight_decay=o["weight_decay"], fused=True)
    b, s = t["micro_batch_size"], t["seq_length"]
    times, losses = hf_steps(model, params, opt, c, t, o, args, device)
    timed = times[args.warmup:]
    print(json.dumps({"tokens_per_sec": b * s * len(timed) / sum(timed), "step_seconds": timed,
                      "losses": losses, "trainable_parameters": sum(p.numel() for p in params),
                      "baseline_rss_kib": baseline_kib, "threads": torch.get_num_threads()}))


def train_hf_vlm(args):
    """HF transformers' Qwen2_5_VLForConditionalGeneration of the composite's shapes, trained on
    the batch shape LoongForge's --mock-data gives (qwen2_5_vl add_mock_fields): per sample the
    first (N / merge)^2 tokens are the placeholders of one N x N-patch image of random pixel rows,
    then random text; fp32, clipping, AdamW (fused), one micro-batch per step."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    cfg = json.loads(args.config_json)
    m, t = cfg["model"], cfg["training"]
    c, v = m["foundation"], m["vision_encoder"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    torch.manual_seed(t.get("seed", 1234))
    baseline_kib = vm_kib("VmRSS")
    nq = c["num_attention_heads"]
    mult = c["make_vocab_size_divisible_by"]
    vocab = (c["vocab_size"] + mult - 1) // mult * mult
    assert c["add_qkv_bias"] and not c["add_bias_linear"] and c["swiglu"], "a Qwen2 backbone"
    vision = dict(depth=v["depth"], hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
                  num_heads=v["num_heads"], in_channels=v["in_channels"], patch_size=v["patch_size"],
                  spatial_merge_size=v["spatial_merge_size"], temporal_patch_size=v["temporal_patch_size"],
                  window_size=v["window_size"], fullatt_block_indexes=v["fullatt_block_indexes"],
                  out_hidden_size=v["out_hidden_size"] or c["hidden_size"], hidden_act=v["hidden_act"],
                  initializer_range=float(v["initializer_range"]), tokens_per_second=m["tokens_per_second"])
    text = dict(vocab_size=vocab, hidden_size=c["hidden_size"], intermediate_size=c["ffn_hidden_size"],
                num_hidden_layers=c["num_layers"], num_attention_heads=nq,
                num_key_value_heads=c["num_query_groups"] or nq, head_dim=c["kv_channels"] or c["hidden_size"] // nq,
                max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=float(c["norm_epsilon"]),
                tie_word_embeddings=not c["untie_embeddings_and_output_weights"], hidden_act="silu",
                rope_parameters={"rope_type": "default", "mrope_section": c["mrope_section"],
                                 "rope_theta": float(c["rotary_base"])})
    hc = Qwen2_5_VLConfig(vision_config=vision, text_config=text,
                          tie_word_embeddings=not c["untie_embeddings_and_output_weights"],
                          image_token_id=m["image_token_id"], video_token_id=m["video_token_id"])
    for sub in (hc, hc.text_config, hc.vision_config):
        sub._attn_implementation = args.attn
    device = torch.device(args.device)
    model = Qwen2_5_VLForConditionalGeneration(hc).to(device).train()
    params = list(model.parameters())
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]),
                            eps=o["adam_eps"], fused=True)
    b, s = t["micro_batch_size"], t["seq_length"]
    assert t["global_batch_size"] == b, "the bench runs one micro-batch per step"
    merge = v["spatial_merge_size"]
    side = m.get("mock_image_patches") or 2 * merge
    n = (side // merge) ** 2
    patch_dim = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2
    grid = torch.tensor([[1, side, side]] * b, device=device)
    image = m["image_token_id"]
    times, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        ids = torch.randint(0, c["vocab_size"], (b, s))
        ids[ids == image] = (image + 2) % c["vocab_size"]
        ids[ids == m["video_token_id"]] = (m["video_token_id"] + 2) % c["vocab_size"]
        ids[:, :n] = image
        labels = ids.clone()
        labels[:, :n] = -100
        pixels = torch.randn(b * side * side, patch_dim)
        ids, labels, pixels = ids.to(device), labels.to(device), pixels.to(device)
        out = model(input_ids=ids, labels=labels, pixel_values=pixels, image_grid_thw=grid,
                    mm_token_type_ids=(ids == image).int(), use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["clip_grad"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        times.append(time.perf_counter() - start)
    timed = times[args.warmup:]
    print(json.dumps({"tokens_per_sec": b * s * len(timed) / sum(timed), "step_seconds": timed,
                      "losses": losses, "parameters": sum(p.numel() for p in params),
                      "vision_parameters": sum(p.numel() for p in model.model.visual.parameters()),
                      "image_tokens_per_sample": n, "baseline_rss_kib": baseline_kib,
                      "threads": torch.get_num_threads(), "attn_implementation": args.attn,
                      "device_peak_mib": (torch.cuda.max_memory_allocated() / 2**20
                                          if device.type == "cuda" else None)}))


def peak(args):
    # The best of a few large square matmuls: what this machine's GEMM libraries reach for the
    # dtype. On the CPU both that libtorch carries: torch.mm (MKL's sgemm for fp32 on x86) and
    # oneDNN's matmul (which LoongForge's fp32 linear layers and output layer use from 16M
    # multiply-adds up: src/backend/gemm.cpp); on some CPUs one is far ahead of the other.
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    sizes = (1024, 2048) if args.device == "cpu" else (4096, 8192)

    def rate(fn, n):
        fn()
        if args.device != "cpu":
            torch.cuda.synchronize()
        reps, start = 0, time.perf_counter()
        while reps < 3 or time.perf_counter() - start < 1.0:
            fn()
            if args.device != "cpu":
                torch.cuda.synchronize()
            reps += 1
            if time.perf_counter() - start > 5.0:  # a slow path (bf16 without native support)
                break
        return 2.0 * n ** 3 * reps / (time.perf_counter() - start)

    libraries = {}
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype).to(args.device), torch.randn(n, n).to(dtype).to(args.device)
        libraries["torch.mm"] = max(libraries.get("torch.mm", 0.0), rate(lambda: torch.mm(a, b), n))
        if args.device == "cpu" and torch.backends.mkldnn.is_available():
            am, wm = a.to_mkldnn(), b.t().contiguous().to_mkldnn()  # a b = a (b^T)^T, as a linear layer
            libraries["oneDNN"] = max(libraries.get("oneDNN", 0.0),
                                      rate(lambda: torch._C._nn.mkldnn_linear(am, wm), n))
        if max(libraries.values()) < 5e9:  # a larger size will not change the verdict, only take minutes
            break
    best = max(libraries, key=libraries.get)
    print(json.dumps({"dtype": args.dtype, "flops_per_sec": libraries[best], "library": best,
                      "libraries": libraries, "threads": torch.get_num_threads()}))


def train_diffusers_wan(args):
    """diffusers' WanTransformer3DModel of the flow_matching composite's foundation, trained the way
    the composite trains (Wan / DiffSynth's flow matching: a timestep index per sample, shifted sigma,
    x_t = (1 - sigma) x0 + sigma eps, target eps - x0, the weighted per-sample MSE) on the batch
    shape LoongForge's --mock-data gives (latents [b, C, F, H, W], text [b, L, text_dim]); fp32,
    clipping, AdamW (fused), one micro-batch per step."""
    from diffusers import WanTransformer3DModel
    cfg = json.loads(args.config_json)
    m, t = cfg["model"], cfg["training"]
    c = m["foundation"]
    o = {k: float(cfg["optimizer"][k]) for k in
         ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")}
    torch.manual_seed(t.get("seed", 1234))
    baseline_kib = vm_kib("VmRSS")
    device = torch.device(args.device)
    model = WanTransformer3DModel(
        patch_size=tuple(c["patch_size"]), num_attention_heads=c["num_attention_heads"],
        attention_head_dim=c["attention_head_dim"], in_channels=c["in_channels"],
        out_channels=c["out_channels"] or c["in_channels"], text_dim=c["text_dim"], freq_dim=c["freq_dim"],
        ffn_dim=c["ffn_dim"], num_layers=c["num_layers"], cross_attn_norm=c["cross_attn_norm"], eps=float(c["eps"]),
        image_dim=c["image_dim"] or None, added_kv_proj_dim=c["added_kv_proj_dim"] or None,
        rope_max_seq_len=c["rope_max_seq_len"]).to(device).train()
    params = list(model.parameters())
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]), eps=o["adam_eps"], fused=True)
    n = int(m["num_train_timesteps"])
    shift = float(m["shift"])
    sig = torch.linspace(1.0, 0.0, n + 1)[:-1]
    sig = shift * sig / (1 + (shift - 1) * sig)
    ts = sig * n
    y = torch.exp(-2 * ((ts - n / 2) / n) ** 2)
    y = y - y.min()
    wt = y * (n / y.sum())
    b = t["micro_batch_size"]
    assert t["global_batch_size"] == b, "the bench runs one micro-batch per step"
    f, h, w = m["mock_latent_shape"]
    times, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        x0 = torch.randn(b, c["in_channels"], f, h, w, device=device)
        text = torch.randn(b, m["mock_text_length"], c["text_dim"], device=device)
        noise = torch.randn_like(x0)
        ids = torch.randint(0, n, (b,))
        s = sig[ids].view(b, 1, 1, 1, 1).to(device)
        xt = (1 - s) * x0 + s * noise
        pred = model(hidden_states=xt, timestep=ts[ids].to(device), encoder_hidden_states=text, return_dict=False)[0]
        per = ((pred.float() - (noise - x0)) ** 2).reshape(b, -1).mean(1) * wt[ids].to(device)
        loss = per.sum() / b
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["clip_grad"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    timed = times[args.warmup:]
    tokens = b * (f // c["patch_size"][0]) * (h // c["patch_size"][1]) * (w // c["patch_size"][2])
    print(json.dumps({"tokens_per_sec": tokens * len(timed) / sum(timed), "step_seconds": timed, "losses": losses,
                      "parameters": sum(p.numel() for p in params), "baseline_rss_kib": baseline_kib,
                      "threads": torch.get_num_threads(),
                      "device_peak_mib": (torch.cuda.max_memory_allocated() / 2**20
                                          if device.type == "cuda" else None)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("--config-json", required=True,
                    help="resolved {model, training, optimizer} from loongforge-train --dry-run")
    tr.add_argument("--steps", type=int, required=True)
    tr.add_argument("--warmup", type=int, required=True)
    tr.add_argument("--bf16", action="store_true")
    tr.add_argument("--compile", action="store_true", help="torch.compile (Inductor) the loss function")
    tr.add_argument("--device", default="cpu", help="cpu or cuda")
    hm = sub.add_parser("train-hf-moe")
    hm.add_argument("--config-json", required=True)
    hm.add_argument("--steps", type=int, required=True)
    hm.add_argument("--warmup", type=int, required=True)
    hm.add_argument("--experts", choices=["eager", "grouped_mm"], default="eager")
    hm.add_argument("--device", default="cpu")
    hl = sub.add_parser("train-hf-lora")
    hl.add_argument("--config-json", required=True)
    hl.add_argument("--steps", type=int, required=True)
    hl.add_argument("--warmup", type=int, required=True)
    hl.add_argument("--rank", type=int, required=True)
    hl.add_argument("--alpha", type=float, required=True)
    hl.add_argument("--targets", required=True, help="q_proj,v_proj or all-linear")
    hl.add_argument("--device", default="cpu")
    hv = sub.add_parser("train-hf-vlm")
    hv.add_argument("--config-json", required=True)
    hv.add_argument("--steps", type=int, required=True)
    hv.add_argument("--warmup", type=int, required=True)
    hv.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    hv.add_argument("--device", default="cpu")
    hw = sub.add_parser("train-diffusers-wan")
    hw.add_argument("--config-json", required=True)
    hw.add_argument("--steps", type=int, required=True)
    hw.add_argument("--warmup", type=int, required=True)
    hw.add_argument("--device", default="cpu")
    pk = sub.add_parser("peak")
    pk.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    pk.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    {"train": train, "train-hf-moe": train_hf_moe, "train-hf-lora": train_hf_lora,
     "train-hf-vlm": train_hf_vlm, "train-diffusers-wan": train_diffusers_wan, "peak": peak}[args.cmd](args)


if __name__ == "__main__":
    main()
