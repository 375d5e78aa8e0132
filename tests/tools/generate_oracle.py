"""Oracle for loongforge-generate tests: loads an HF model directory with transformers and writes
its fp32 logits for the given ids (tensor "logits" [tokens, vocab]) and its greedy continuation.

usage: generate_oracle.py HF_DIR IDS(1,2,3) MAX_NEW_TOKENS OUT.safetensors
prints: greedy: id,id,...
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def main():
    hf_dir, ids_text, max_new, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ids = torch.tensor([[int(x) for x in ids_text.split(",")]])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(ids).logits[0].float().contiguous()
        save_file({"logits": logits}, out)
        seq = ids
        new = []
        for _ in range(max_new):  # greedy, recomputing the prefix (no cache, no generation config)
            nxt = int(model(seq).logits[0, -1].argmax())
            new.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    print("greedy: " + ",".join(str(x) for x in new))


if __name__ == "__main__":
    main()
