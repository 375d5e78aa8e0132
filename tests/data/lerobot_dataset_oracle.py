"""Oracle for the LeRobot dataset reader (tests/data/test_lerobot_dataset.cpp), run with the LeRobot
venv (.venv-lerobot, lerobot 0.6): `python lerobot_dataset_oracle.py make DIR` writes

  DIR/v30/                a v3.0 dataset written by lerobot itself (LeRobotDataset.create, add_frame,
                          save_episode, finalize): 3 episodes of 12, 7 and 9 frames at 10 fps, two AV1
                          cameras of 32x48, observation.state [3] and action [2] float32, 2 tasks
  DIR/v30_items.safetensors  what LeRobotDataset(root=v30, delta_timestamps=DELTAS, return_uint8=True)
                          returns for every frame i: "<i>/<key>" (frames uint8, states, actions,
                          indices, <key>_is_pad); DIR/v30_items.json: the task string of every frame
  DIR/v30_episode1.safetensors  episode 1 stacked from LeRobotDataset without deltas (what
                          `loongforge-data inspect --dump-episode 1` must write)
  DIR/norm.safetensors    lerobot's NormalizerProcessorStep on every frame's state and action per
                          mode (and the inverse), "<mode>/<key>" and "<mode>/inverse/<key>"
  DIR/v21/                the same recording in the v2.1 layout (per-episode parquet, per-episode mp4
                          encoded by lerobot's encode_video_frames, jsonl metadata, episodes_stats)
  DIR/v21_frames.safetensors  lerobot's decode_video_frames (pyav) of every v2.1 episode at its
                          timestamps: "<episode>/<key>" uint8 [T, C, H, W]
  DIR/v21_stats.safetensors   lerobot's aggregate_stats over the episodes' stats: "<key>/<stat>"
  DIR/short.mp4           a 3-frame video (episode 2's camera cut short, for the error test)
  DIR/multi/, DIR/multi_items.{safetensors,json}  the v3.0 recording again with file size limits
                          so small that each episode gets its own data, video and episode-table
                          files (file-000 .. file-002), and its items as for v30
  DIR/images/             a v3.0 dataset recorded with use_videos=False (one camera of dtype "image",
                          PNG bytes in the data parquet), 2 episodes of 3 and 4 frames;
                          DIR/images_items.safetensors: LeRobotDataset's items ("<i>/<key>", the
                          camera float32 [C, H, W] in [0, 1] as ToTensor makes it)
  DIR/done
Nothing reaches the network (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE).
"""

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature  # noqa: E402
from lerobot.datasets.compute_stats import aggregate_stats  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402
from lerobot.datasets.video_utils import decode_video_frames, encode_video_frames  # noqa: E402
from lerobot.processor.normalize_processor import NormalizerProcessorStep  # noqa: E402

FPS = 10
H, W = 32, 48
LENGTHS = [12, 7, 9]
TASKS = ["pick up the red cube", "put the cube in the bowl", "pick up the red cube"]
CAMERAS = ["observation.images.front", "observation.images.wrist"]
DELTAS = {
    "action": [0.0, 0.1, 0.2, 0.3],
    "observation.state": [-0.1, 0.0],
    "observation.images.front": [-0.2, 0.0],
}


def frame_image(cam, ep, t):
    """Smooth gradients and a moving square: detail the codec keeps, and every frame differs."""
    yy, xx = np.mgrid[0:H, 0:W]
    base = np.stack([(xx * 5 + ep * 40) % 256, (yy * 7 + t * 9) % 256, ((xx + yy) * 3 + ep * 80) % 256], -1)
    img = base.astype(np.uint8)
    y0, x0 = 4 + (t * 2) % (H - 12), 4 + (t * 3 + ep * 5) % (W - 12)
    img[y0:y0 + 8, x0:x0 + 8] = [250, 30, 30] if cam == 0 else [30, 220, 60]
    return img if cam == 0 else np.ascontiguousarray(img[:, ::-1])


def record_v30(root, repo_id="lf/lerobot_oracle", **create_args):
    features = {
        cam: {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]} for cam in CAMERAS
    }
    features["observation.state"] = {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]}
    features["action"] = {"dtype": "float32", "shape": (2,), "names": ["dx", "dy"]}
    ds = LeRobotDataset.create(repo_id, fps=FPS, features=features, root=root, use_videos=True, **create_args)
    rng = np.random.default_rng(7)
    for ep, length in enumerate(LENGTHS):
        for t in range(length):
            frame = {cam: frame_image(c, ep, t) for c, cam in enumerate(CAMERAS)}
            frame["observation.state"] = rng.standard_normal(3).astype(np.float32)
            frame["action"] = rng.standard_normal(2).astype(np.float32)
            frame["task"] = TASKS[ep]
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()


def write_items(repo_id, root, out, name):
    ds = LeRobotDataset(repo_id, root=root, delta_timestamps=DELTAS, return_uint8=True, video_backend="pyav")
    tensors, tasks = {}, []
    for i in range(len(ds)):
        item = ds[i]
        for k, v in item.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{i}/{k}"] = v.contiguous()
        tasks.append(item["task"])
    save_file(tensors, str(out / f"{name}_items.safetensors"))
    (out / f"{name}_items.json").write_text(json.dumps({"tasks": tasks, "num_frames": len(ds)}))


def items(root, out):
    write_items("lf/lerobot_oracle", root, out, "v30")

    # Episode 1 as a trainer sees it: no deltas, one tensor per key over its frames.
    plain = LeRobotDataset("lf/lerobot_oracle", root=root, return_uint8=True, video_backend="pyav")
    ep = plain.meta.episodes[1]
    rows = [plain[i] for i in range(ep["dataset_from_index"], ep["dataset_to_index"])]
    dump = {}
    for k, v in rows[0].items():
        if isinstance(v, torch.Tensor):
            dump[k] = torch.stack([r[k] for r in rows]).contiguous()
    save_file(dump, str(out / "v30_episode1.safetensors"))

    # Normalisation: NormalizerProcessorStep's transform with the dataset's stats, every mode.
    states = torch.stack([plain[i]["observation.state"] for i in range(len(plain))])
    actions = torch.stack([plain[i]["action"] for i in range(len(plain))])
    feats = {"observation.state": PolicyFeature(FeatureType.STATE, (3,)), "action": PolicyFeature(FeatureType.ACTION, (2,))}
    norm = {}
    for mode in [NormalizationMode.MEAN_STD, NormalizationMode.MIN_MAX, NormalizationMode.QUANTILES,
                 NormalizationMode.QUANTILE10, NormalizationMode.IDENTITY]:
        step = NormalizerProcessorStep(features=feats, norm_map={FeatureType.STATE: mode, FeatureType.ACTION: mode},
                                       stats=plain.meta.stats)
        for key, x, ft in [("observation.state", states, FeatureType.STATE), ("action", actions, FeatureType.ACTION)]:
            y = step._apply_transform(x.clone(), key, ft)
            norm[f"{mode.value}/{key}"] = y.contiguous()
            norm[f"{mode.value}/inverse/{key}"] = step._apply_transform(y.clone(), key, ft, inverse=True).contiguous()
    norm["input/observation.state"] = states.contiguous()
    norm["input/action"] = actions.contiguous()
    save_file(norm, str(out / "norm.safetensors"))


def write_v21(v30, v21, out):
    """The same recording in the v2.1 layout (lerobot 0.3's): per-episode files, jsonl metadata."""
    info = json.loads((v30 / "meta/info.json").read_text())
    info["codebase_version"] = "v2.1"
    info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    info["video_path"] = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    info["total_chunks"] = 1
    info["total_videos"] = len(LENGTHS) * len(CAMERAS)
    for k in ["data_files_size_in_mb", "video_files_size_in_mb"]:
        info.pop(k, None)
    (v21 / "meta").mkdir(parents=True)
    (v21 / "meta/info.json").write_text(json.dumps(info, indent=4))
    tasks = pq.read_table(v30 / "meta/tasks.parquet").to_pylist()
    with open(v21 / "meta/tasks.jsonl", "w") as f:
        for t in sorted(tasks, key=lambda t: t["task_index"]):
            f.write(json.dumps({"task_index": t["task_index"], "task": t["task"]}) + "\n")
    episodes = pq.read_table(v30 / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    data = pq.read_table(v30 / "data/chunk-000/file-000.parquet")
    stats_list = []
    with open(v21 / "meta/episodes.jsonl", "w") as fe, open(v21 / "meta/episodes_stats.jsonl", "w") as fs:
        for ep in episodes:
            e = ep["episode_index"]
            fe.write(json.dumps({"episode_index": e, "tasks": ep["tasks"], "length": ep["length"]}) + "\n")
            stats = {}
            for k, v in ep.items():
                if k.startswith("stats/"):
                    _, key, stat = k.split("/")
                    stats.setdefault(key, {})[stat] = v
            fs.write(json.dumps({"episode_index": e, "stats": stats}) + "\n")
            stats_list.append({k: {s: np.array(v) for s, v in d.items()} for k, d in stats.items()})
            rows = data.slice(ep["dataset_from_index"], ep["length"])
            path = v21 / f"data/chunk-000/episode_{e:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, path)
            for c, cam in enumerate(CAMERAS):
                with tempfile.TemporaryDirectory() as d:
                    for t in range(ep["length"]):
                        Image.fromarray(frame_image(c, e, t)).save(f"{d}/frame-{t:06d}.png")
                    video = v21 / f"videos/chunk-000/{cam}/episode_{e:06d}.mp4"
                    video.parent.mkdir(parents=True, exist_ok=True)
                    encode_video_frames(d, video, FPS)
    agg = aggregate_stats(stats_list)
    save_file({f"{k}/{s}": torch.from_numpy(np.asarray(v, dtype=np.float64)).contiguous()
               for k, d in agg.items() for s, v in d.items()}, str(out / "v21_stats.safetensors"))

    frames = {}
    for ep in episodes:
        e = ep["episode_index"]
        ts = pq.read_table(v21 / f"data/chunk-000/episode_{e:06d}.parquet").column("timestamp").to_pylist()
        for cam in CAMERAS:
            video = v21 / f"videos/chunk-000/{cam}/episode_{e:06d}.mp4"
            frames[f"{e}/{cam}"] = decode_video_frames(video, ts, 1e-4, "pyav", return_uint8=True).contiguous()
    save_file(frames, str(out / "v21_frames.safetensors"))

    with tempfile.TemporaryDirectory() as d:
        for t in range(3):
            Image.fromarray(frame_image(0, 2, t)).save(f"{d}/frame-{t:06d}.png")
        encode_video_frames(d, out / "short.mp4", FPS)


def record_images(root, out):
    features = {
        "observation.image": {"dtype": "image", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
    }
    ds = LeRobotDataset.create("lf/lerobot_images", fps=FPS, features=features, root=root, use_videos=False)
    for ep, length in enumerate([3, 4]):
        for t in range(length):
            ds.add_frame({"observation.image": frame_image(0, ep, t),
                          "observation.state": np.array([ep, t], dtype=np.float32), "task": TASKS[ep]})
        ds.save_episode()
    ds.finalize()
    ds = LeRobotDataset("lf/lerobot_images", root=root)
    tensors = {f"{i}/{k}": v.contiguous() for i in range(len(ds)) for k, v in ds[i].items()
               if isinstance(v, torch.Tensor)}
    save_file(tensors, str(out / "images_items.safetensors"))


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: lerobot_dataset_oracle.py make DIR")
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    v30 = out / "v30"
    if v30.exists():
        shutil.rmtree(v30)
    record_v30(v30)
    items(v30, out)
    write_v21(v30, out / "v21", out)
    record_images(out / "images", out)
    # Tiny file size limits: every episode in its own data, video and episode-table file.
    record_v30(out / "multi", "lf/lerobot_multi", video_files_size_in_mb=0.001, data_files_size_in_mb=0.001,
               metadata_buffer_size=1)
    write_items("lf/lerobot_multi", out / "multi", out, "multi")
    (out / "done").write_text("ok\n")
    # Skip the interpreter's teardown: under CPU contention a thread of the video stack is now and
    # then destroyed still joinable there ("terminate called without an active exception", exit
    # 134) after everything above was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
