"""HF transformers oracle for the HF conversion parity tests (tests/models/test_hf_parity.cpp).
Python is a test oracle only; LoongForge never runs it.

  hf_oracle.py make OUT
      For each family (llama, qwen2 (with YaRN), qwen3, qwen3_moe, deepseek_v3, deepseek_v2, deepseek_v32): a tiny random model (fixed seed, GQA, vocabulary 200
      so LoongForge pads it, every norm weight and bias random too), saved with save_pretrained to
      OUT/<family>/hf (fp32, sharded with an index for llama) and OUT/<family>/hf_bf16 (bf16,
      sharded), and OUT/<family>/logits.safetensors: input_ids [2, 9] int64, logits [2, 9, 200]
      fp32 of the fp32 model. For deepseek_v3 also one multi-token prediction layer
      (model.layers.3.*: DeepSeek-V3's enorm, hnorm, eh_proj, a decoder layer, shared_head, and
      the copies of the embedding and the output layer), random, added to both directories, and
      `mtp_logits` [2, 9, 200]: that layer's logits computed here from transformers' own modules
      (DeepseekV3DecoderLayer, its RMSNorm and rotary embedding) as DeepSeek-V3 defines MTP
      (transformers has no MTP).
      Also OUT/moe_blocks/deepseek_v3.safetensors: transformers' DeepseekV3MoE (sigmoid scores,
      group-limited routing, the score-correction bias, routed scaling, a shared expert) with
      random weights and bias, its input `x` [2, 7, 32] and output `y`, and the weights under
      their HF names. And OUT/moe_blocks/mla{_q_lora,_no_q_lora}.safetensors: transformers'
      DeepseekV3Attention (multi-latent attention, YaRN RoPE with mscale != mscale_all_dim,
      interleaved rotary dims), input `x` [2, 9, 64] at positions 0..8, causal, output `y`.
      And OUT/deepseek_v3/hf_fp8 + fp8_logits.safetensors: the same checkpoint FP8 block-quantized
      as DeepSeek-V3's release stores it, and the logits of its dequantized weights (fp8_checkpoint).
  hf_oracle.py logits DIR IDS OUT [DIR IDS OUT ...]
      Loads DIR with AutoModelForCausalLM (fp32) and writes its logits for IDS's input_ids to OUT.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                          DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV32Config,
                          DeepseekV32ForCausalLM)

VOCAB = 200
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)


def families():
    return {
        # Untied, llama3 RoPE scaling (original context 32: head_dim 16 has frequencies on both
        # sides of the scaled band and in it).
        "llama": (LlamaForCausalLM, LlamaConfig(
            **COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
        # Tied embeddings, QKV bias, YaRN as Qwen2.5 publishes it for long context (transformers-4
        # "type", only factor and the original context; head_dim 16 has frequencies kept,
        # interpolated and blended).
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **{**COMMON, "max_position_embeddings": 16384}, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_theta=10000.0,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})),
        # Untied, QK RMSNorm, head_dim 32 != hidden / heads.
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **COMMON, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_theta=1000000.0)),
        # MoE: 3 layers, the middle one dense (mlp_only_layers), 4 experts, top-2 renormalised.
        "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            **{**COMMON, "num_hidden_layers": 3}, head_dim=16, rms_norm_eps=1e-6,
            tie_word_embeddings=False, rope_theta=1000000.0, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=40, mlp_only_layers=[1], norm_topk_prob=True)),
        # MLA (query bottleneck, YaRN with mscale != mscale_all_dim, interleaved rotary dims), the
        # first layer dense, 8 experts in 4 groups (2 per token), top-4, sigmoid scores with the
        # score-correction bias, scaled, one shared expert; one multi-token prediction layer
        # (transformers builds none: its weights are added to the files, see add_mtp).
        "deepseek_v3": (DeepseekV3ForCausalLM, DeepseekV3Config(
            **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4}, rms_norm_eps=1e-6,
            tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_group=4, topk_group=2,
            num_experts_per_tok=4, moe_intermediate_size=24, n_shared_experts=1,
            first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            num_nextn_predict_layers=1, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                             "original_max_position_embeddings": 16, "beta_fast": 32,
                             "beta_slow": 1, "rope_theta": 10000.0})),
        # DeepSeek-V2(-Lite): MLA without the query bottleneck, softmax routing (greedy top-3 of 8,
        # unnormalised, scaled by 1.5), two shared experts, the first layer dense.
        "deepseek_v2": (DeepseekV2ForCausalLM, DeepseekV2Config(
            **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4}, rms_norm_eps=1e-6,
            tie_word_embeddings=False, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=3,
            moe_intermediate_size=24, n_shared_experts=2, first_k_dense_replace=1,
            routed_scaling_factor=1.5, topk_method="greedy",
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 16, "beta_fast": 32,
                             "beta_slow": 1, "rope_theta": 10000.0})),
        # DeepSeek-V3.2: DeepSeek-V3's MLA and MoE with DSA: a lightning indexer of 8 heads of 16
        # dims (its first 8 rotary) picks 4 of the keys per query (9 tokens: the later queries
        # attend to 4 of up to 9); make() checks that no query's 4th and 5th index scores tie.
        "deepseek_v32": (DeepseekV32ForCausalLM, DeepseekV32Config(
            **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4}, rms_norm_eps=1e-6,
            tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_group=4, topk_group=2,
            num_experts_per_tok=4, moe_intermediate_size=24, n_shared_experts=1,
            first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            index_n_heads=8, index_head_dim=16, index_topk=4,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                             "original_max_position_embeddings": 16, "beta_fast": 32,
                             "beta_slow": 1, "rope_theta": 10000.0})),
    }


def check_no_index_ties(model, ids):
    # The selection must not depend on how a top-k kernel orders equal scores: every query's k-th
    # and (k+1)-th index scores differ.
    gaps = []

    def hook(module, args, kwargs, out):
        hs, q_resid, (cos, sin), mask = args[0], args[1], args[2], args[3]
        b, s, _ = hs.shape
        q = module.wq_b(q_resid).view(b, s, module.n_heads, module.head_dim)
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
        k = module.k_norm(module.wk(hs)).unsqueeze(2)
        r = module.qk_rope_head_dim
        qr, kr = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
        q = torch.cat([qr, q[..., r:]], -1)
        k = torch.cat([kr, k[..., r:]], -1).squeeze(2)
        sc = torch.relu(torch.einsum("bshd,btd->bsht", q.float(), k.float()) * module.softmax_scale)
        w = module.weights_proj(hs).float() * module.n_heads ** -0.5
        idx = (sc * w.unsqueeze(-1)).sum(2)
        for bi in range(b):
            for i in range(s):
                row = idx[bi, i, :i + 1].sort(descending=True).values
                if row.numel() > module.index_topk:
                    gaps.append((row[module.index_topk - 1] - row[module.index_topk]).item())

    handles = [layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    logits_of(model, ids)
    for h in handles:
        h.remove()
    assert gaps and min(gaps) > 1e-4, f"index score ties at the top-k boundary: {min(gaps)}"


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.endswith("mlp.gate.weight"):  # router: decisive scores, no near-ties
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.05 * noise)


def randomize_buffers(model, seed):
    # DeepSeek's score-correction bias is a buffer (saved with the weights): make it matter.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g))


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def make(out):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(7))
    for seed, (family, (cls, config)) in enumerate(families().items()):
        torch.manual_seed(seed)
        config.architectures = [cls.__name__]
        model = cls(config).float().eval()
        randomize(model, 100 + seed)
        randomize_buffers(model, 200 + seed)
        d = os.path.join(out, family)
        shard = "20KB" if family == "llama" else "50GB"
        model.save_pretrained(os.path.join(d, "hf"), max_shard_size=shard)
        outputs = {"input_ids": ids, "logits": logits_of(model, ids)}
        if family == "deepseek_v32":
            check_no_index_ties(model, ids)
        mtp = None
        if getattr(config, "num_nextn_predict_layers", 0):
            mtp, outputs["mtp_logits"] = add_mtp(model, ids, 300 + seed)
            append_tensors(os.path.join(d, "hf"), mtp)
        save_file(outputs, os.path.join(d, "logits.safetensors"))
        model.to(torch.bfloat16).save_pretrained(os.path.join(d, "hf_bf16"), max_shard_size="30KB")
        if mtp is not None:
            append_tensors(os.path.join(d, "hf_bf16"), {n: t.to(torch.bfloat16) for n, t in mtp.items()})
    moe_blocks(out)
    mla_blocks(out)
    fp8_checkpoint(out, "deepseek_v3", ids)


FP8_BLOCK = [16, 32]  # DeepSeek-V3 ships [128, 128]; smaller here so that the tiny matrices have
                      # several blocks, partial ones at their edges, and rows != columns catches a swap
FP8_LINEAR = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj",
              "up_proj", "down_proj", "eh_proj")


def fp8_checkpoint(out, family, ids):
    """OUT/<family>/hf_fp8: the family's checkpoint as DeepSeek-V3's FP8 release stores it
    (config.json quantization_config {quant_method: fp8, fmt: e4m3, weight_block_size}; every linear
    projection's weight in float8_e4m3fn with a float32 <name>_scale_inv per block, the block's
    amax / 448; embeddings, norms, the router and its bias unquantized), and
    OUT/<family>/fp8_logits.safetensors: input_ids and the logits of the model whose weights are the
    dequantized ones (weight x its block's scale_inv, DeepSeek's weight_dequant)."""
    import json
    import re
    src = os.path.join(out, family, "hf")
    d = os.path.join(out, family, "hf_fp8")
    os.makedirs(d, exist_ok=True)
    tensors = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, f)))
    r, c = FP8_BLOCK
    stored, dequantized = {}, {}
    pattern = re.compile(r".*\.(%s)\.weight$" % "|".join(FP8_LINEAR))
    for name, w in tensors.items():
        if not pattern.match(name):
            stored[name] = w
            continue
        rows, cols = w.shape
        br, bc = -(-rows // r), -(-cols // c)
        padded = torch.zeros(br * r, bc * c)
        padded[:rows, :cols] = w
        amax = padded.view(br, r, bc, c).abs().amax(dim=(1, 3))
        scale_inv = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        full = scale_inv.repeat_interleave(r, 0).repeat_interleave(c, 1)[:rows, :cols]
        q = (w / full).clamp(-448, 448).to(torch.float8_e4m3fn)
        stored[name] = q
        stored[name + "_scale_inv"] = scale_inv.contiguous()
        dequantized[name] = q.float() * full
    save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": FP8_BLOCK}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    # The dequantized checkpoint (fp32, unquantized config), loaded as transformers loads any.
    plain = os.path.join(out, family, "hf_fp8_dequantized")
    os.makedirs(plain, exist_ok=True)
    save_file({**tensors, **dequantized}, os.path.join(plain, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(plain, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    save_file({"input_ids": ids, "logits": logits_of(model, ids)}, os.path.join(out, family, "fp8_logits.safetensors"))


def add_mtp(model, ids, seed):
    """One DeepSeek-V3 multi-token prediction layer after the model's layers, random: its HF
    tensors and its logits for ids. Layer input: [enorm(embed(ids shifted one left, 0 at the end));
    hnorm(the decoder's output before its final norm)] -> eh_proj -> a decoder layer ->
    shared_head.norm -> the output layer."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
    c = model.config
    n = c.num_hidden_layers
    h = c.hidden_size
    torch.manual_seed(seed)
    layer = DeepseekV3DecoderLayer(c, layer_idx=n).float().eval()
    randomize(layer, seed + 1)
    randomize_buffers(layer, seed + 2)
    enorm, hnorm, head_norm = (DeepseekV3RMSNorm(h, eps=c.rms_norm_eps) for _ in range(3))
    eh_proj = torch.nn.Linear(2 * h, h, bias=False)
    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for norm in (enorm, hnorm, head_norm):
            norm.weight.copy_(1.0 + 0.2 * torch.randn(h, generator=g))
        eh_proj.weight.copy_(0.05 * torch.randn(h, 2 * h, generator=g))
    captured = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: captured.setdefault("h", a[0]))
    with torch.no_grad():
        model(input_ids=ids)
        hook.remove()
        shifted = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
        x = eh_proj(torch.cat([enorm(model.model.embed_tokens(shifted)), hnorm(captured["h"])], -1))
        s = ids.shape[1]
        position_ids = torch.arange(s)[None].expand(ids.shape[0], -1)
        mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_ids=position_ids,
                    position_embeddings=model.model.rotary_emb(x, position_ids))
        out = out[0] if isinstance(out, tuple) else out
        logits = model.lm_head(head_norm(out)).float().contiguous()
    p = f"model.layers.{n}."
    tensors = {}
    for k, v in layer.state_dict().items():
        v = v.detach().clone().contiguous()
        # transformers 5 keeps the experts fused in memory; save_pretrained writes them per expert.
        if k == "mlp.experts.gate_up_proj":
            for e, w in enumerate(v):
                gate, up = w.chunk(2, dim=0)
                tensors[p + f"mlp.experts.{e}.gate_proj.weight"] = gate.contiguous()
                tensors[p + f"mlp.experts.{e}.up_proj.weight"] = up.contiguous()
        elif k == "mlp.experts.down_proj":
            for e, w in enumerate(v):
                tensors[p + f"mlp.experts.{e}.down_proj.weight"] = w.contiguous()
        else:
            tensors[p + k] = v
    tensors.update({p + "enorm.weight": enorm.weight.detach().clone(), p + "hnorm.weight": hnorm.weight.detach().clone(),
                    p + "eh_proj.weight": eh_proj.weight.detach().clone(),
                    p + "shared_head.norm.weight": head_norm.weight.detach().clone(),
                    p + "embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(),
                    p + "shared_head.head.weight": model.lm_head.weight.detach().clone()})
    return tensors, logits


def append_tensors(d, tensors):
    """Adds tensors to a save_pretrained directory: into model.safetensors, or as one more shard
    listed in the index."""
    import json
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        save_file(tensors, os.path.join(d, "model-mtp.safetensors"), metadata={"format": "pt"})
        with open(index) as f:
            j = json.load(f)
        for name in tensors:
            j["weight_map"][name] = "model-mtp.safetensors"
        with open(index, "w") as f:
            json.dump(j, f, indent=2)
    else:
        path = os.path.join(d, "model.safetensors")
        merged = load_file(path)
        merged.update(tensors)
        save_file(merged, path, metadata={"format": "pt"})


def moe_blocks(out):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    c = DeepseekV3Config(hidden_size=32, moe_intermediate_size=16, n_routed_experts=8, n_group=4,
                         topk_group=2, num_experts_per_tok=4, routed_scaling_factor=2.5,
                         n_shared_experts=1, norm_topk_prob=True, hidden_act="silu")
    torch.manual_seed(5)
    block = DeepseekV3MoE(c).float().eval()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _, p in block.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        block.gate.e_score_correction_bias.copy_(0.2 * torch.randn(8, generator=g))
    x = torch.randn(2, 7, 32, generator=g)
    with torch.no_grad():
        y = block(x)
    tensors = {"x": x, "y": y.contiguous(), "gate.e_score_correction_bias": block.gate.e_score_correction_bias}
    tensors.update({n: p.detach().contiguous() for n, p in block.named_parameters()})
    os.makedirs(os.path.join(out, "moe_blocks"), exist_ok=True)
    save_file(tensors, os.path.join(out, "moe_blocks", "deepseek_v3.safetensors"))


def mla_blocks(out):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention,
                                                                       DeepseekV3RotaryEmbedding)
    for tag, q_lora in (("q_lora", 24), ("no_q_lora", None)):
        c = DeepseekV3Config(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora,
            kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            max_position_embeddings=128, rms_norm_eps=1e-6, rope_interleave=True,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                             "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
                             "rope_theta": 10000.0})
        c._attn_implementation = "sdpa"
        torch.manual_seed(8)
        block = DeepseekV3Attention(c, 0).float().eval()
        g = torch.Generator().manual_seed(9)
        with torch.no_grad():
            for name, p in block.named_parameters():
                noise = torch.randn(p.shape, generator=g)
                p.copy_(1.0 + 0.2 * noise if name.endswith("layernorm.weight") else 0.2 * noise)
        x = torch.randn(2, 9, 64, generator=g)
        cos, sin = DeepseekV3RotaryEmbedding(c)(x, torch.arange(9)[None].expand(2, 9))
        with torch.no_grad():
            y, _ = block(x, (cos, sin), None)
        tensors = {"x": x, "y": y.contiguous()}
        tensors.update({n: p.detach().contiguous() for n, p in block.named_parameters()})
        os.makedirs(os.path.join(out, "moe_blocks"), exist_ok=True)
        save_file(tensors, os.path.join(out, "moe_blocks", f"mla_{tag}.safetensors"))


def logits(triplets):
    for i in range(0, len(triplets), 3):
        d, ids_file, out = triplets[i:i + 3]
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        ids = load_file(ids_file)["input_ids"]
        save_file({"input_ids": ids, "logits": logits_of(model, ids)}, out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 5 and sys.argv[1] == "logits" and len(sys.argv[2:]) % 3 == 0:
        logits(sys.argv[2:])
    else:
        sys.exit(__doc__)
