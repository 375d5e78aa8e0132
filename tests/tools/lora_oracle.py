"""Oracle for the LoRA tests (Python only in tests): PEFT's LoraModel on transformers.

  lora_oracle.py make HF_DIR ADAPTER_DIR TARGETS(q_proj,v_proj|all-linear) R ALPHA RSLORA(0|1) SEED
      writes a PEFT adapter for the model in HF_DIR with random A and B (a trained-looking
      adapter, not PEFT's zero-B start).
  lora_oracle.py logits HF_DIR ADAPTER_DIR|- IDS(1,2,3) OUT.safetensors
      the fp32 logits [tokens, vocab] of PeftModel.from_pretrained(base, ADAPTER_DIR) (or of the
      base alone with -), tensor "logits".
"""
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def make(hf_dir, adapter_dir, targets, r, alpha, rslora, seed):
    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    target_modules = "all-linear" if targets == "all-linear" else targets.split(",")
    config = LoraConfig(r=int(r), lora_alpha=float(alpha), target_modules=target_modules, lora_dropout=0.0,
                        use_rslora=rslora == "1", init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(int(seed))
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    model.save_pretrained(adapter_dir)


def logits(hf_dir, adapter_dir, ids_text, out):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if adapter_dir != "-":
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    ids = torch.tensor([[int(x) for x in ids_text.split(",")]])
    with torch.no_grad():
        save_file({"logits": model(ids).logits[0].float().contiguous()}, out)


if __name__ == "__main__":
    {"make": make, "logits": logits}[sys.argv[1]](*sys.argv[2:])
