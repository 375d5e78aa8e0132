"""Oracle for training pi05 on a LeRobot dataset (tests/vla/test_lerobot_pi05_inputs.cpp), run with
the LeRobot venv (.venv-lerobot, lerobot 0.6): `python pi05_lerobot_inputs_oracle.py make DIR` writes

  DIR/v30/              the v3.0 dataset tests/data/lerobot_dataset_oracle.py records (lerobot itself:
                        3 episodes at 10 fps, two AV1 cameras of 32x48, observation.state [3], action [2])
  DIR/tokenizer/        a PaliGemma-style tokenizer (SentencePiece-style BPE: "▁" for spaces, byte
                        fallback, <bos> by the post-processor, <pad> 0) with tokenizer_config.json
  DIR/expected.safetensors  every frame as PI05Policy.forward sees it after LeRobot's pi05
                        preprocessor (make_pi05_pre_post_processors with the dataset's stats, the
                        tokenizer above in place of google/paligemma-3b-pt-224, tokenizer_max_length
                        PROMPT) and its own _preprocess_images / prepare_action: images [N, 2, 3, S, S]
                        in [-1, 1] (resize_with_pad to S x S), tokens [N, PROMPT] int64, masks
                        [N, PROMPT] uint8, actions [N, CHUNK, MAX_ACTION] (QUANTILES-normalised, the
                        delta window range(CHUNK) / fps, zero-padded)
  DIR/prompts.json      the prompt string of every frame
  DIR/done
Nothing reaches the network.
"""
import json
import os
import shutil
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

import lerobot_dataset_oracle as data_oracle  # noqa: E402
from lerobot.configs import FeatureType, PolicyFeature  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402
from lerobot.policies.common.vla_utils import pad_vector, resize_with_pad_torch  # noqa: E402
from lerobot.policies.pi05 import processor_pi05  # noqa: E402
from lerobot.policies.pi05.configuration_pi05 import PI05Config  # noqa: E402

S, CHUNK, MAX_ACTION, PROMPT = 32, 4, 6, 48


def make_tokenizer(out):
    words = ("Task: State: Action: pick up the red cube put in bowl , ; : 0 1 2 3 4 5 6 7 8 9 " * 20).split()
    corpus = [" ".join(words[i:i + 12]) + "\n" for i in range(0, len(words), 7)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=150, special_tokens=["<pad>", "<eos>", "<bos>",
                                                                                         "<unk>"],
                                                        limit_alphabet=30, show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    bos = vocab["<bos>"]
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "model_max_length": 1000000}))


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: pi05_lerobot_inputs_oracle.py make DIR")
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    root = out / "v30"
    if root.exists():
        shutil.rmtree(root)
    data_oracle.record_v30(root)
    make_tokenizer(out / "tokenizer")

    # LeRobot's training data path for pi05: deltas range(chunk) / fps on the action.
    fps = data_oracle.FPS
    ds = LeRobotDataset("lf/lerobot_oracle", root=root, video_backend="pyav",
                        delta_timestamps={"action": [k / fps for k in range(CHUNK)]})
    features = {cam: PolicyFeature(type=FeatureType.VISUAL, shape=(3, data_oracle.H, data_oracle.W))
                for cam in data_oracle.CAMERAS}
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(3,))
    config = PI05Config(chunk_size=CHUNK, n_action_steps=CHUNK, max_action_dim=MAX_ACTION, max_state_dim=8,
                        image_resolution=(S, S), tokenizer_max_length=PROMPT, input_features=features,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
                        device="cpu")
    step = processor_pi05.TokenizerProcessorStep
    processor_pi05.TokenizerProcessorStep = lambda **kw: step(**dict(kw, tokenizer_name=str(out / "tokenizer")))
    try:
        pre, _ = processor_pi05.make_pi05_pre_post_processors(config, dataset_stats=ds.meta.stats)
    finally:
        processor_pi05.TokenizerProcessorStep = step

    items = [ds[i] for i in range(len(ds))]
    batch = torch.utils.data.default_collate(items)
    # The prompts, for the record (the step that builds them, on a copy of what precedes it).
    processed = pre(batch)
    images = []
    for key in config.image_features:  # PI05Policy._preprocess_images, every camera present
        img = processed[key].to(torch.float32).permute(0, 2, 3, 1)
        if img.shape[1:3] != config.image_resolution:
            img = resize_with_pad_torch(img, *config.image_resolution)
        images.append((img * 2.0 - 1.0).permute(0, 3, 1, 2))
    tokens = processed["observation.language.tokens"]
    masks = processed["observation.language.attention_mask"]
    actions = pad_vector(processed["action"], MAX_ACTION)
    save_file({"images": torch.stack(images, 1).contiguous(), "tokens": tokens.to(torch.int64).contiguous(),
               "masks": masks.to(torch.uint8).contiguous(), "actions": actions.contiguous().float()},
              str(out / "expected.safetensors"))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    (out / "prompts.json").write_text(json.dumps([tok.decode(t[m.bool()]) for t, m in zip(tokens, masks)]))
    (out / "done").write_text("ok\n")


if __name__ == "__main__":
    main()
