"""The reach demo's locating probe (docs/vla.md, "The initialisation plateau"): how fast a
pi05-shaped prefix (a tiny SigLIP, a projector, a bidirectional transformer, the head tied to the
token embedding) learns to read the named block's and target's positions from a reach-task image,
under different initialisations. Python and PyTorch here are a research tool, not the engine.

  .venv/bin/python tools/vla_locate_probe.py --init fan_in --posemb sincos2d [--scene-queries]
      [--fixed-colour] [--steps 3000] [--lr 1e-3] [--threads 1]

Scenes are drawn as the task draws them (src/vla/reach_env.cpp: 2-4 blocks, 2-3 target outlines,
colours red/green/blue/yellow, a gripper cross) with numpy; every 500 steps it prints the held-out
cross entropy of the four named queries (block x, y, target x, y in 32 bins) and the fraction within
one bin (with --scene-queries also that of the sixteen per-colour queries).
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

S, P, BINS = 64, 8, 32
RGB = np.array([[220, 40, 40], [40, 200, 60], [50, 90, 230], [230, 210, 40]], np.uint8)
BIN0 = 20  # token ids: 1-5 words, 6-9 colours, 10-13 named queries, 20-51 bins, 52-67 scene queries


def apart(a, b, sa, sb, margin):
    return abs(a[0] - b[0]) >= (sa + sb) / 2 + margin or abs(a[1] - b[1]) >= (sa + sb) / 2 + margin


def scene(r, fixed_colour):
    bc = 0 if fixed_colour else int(r.integers(4))
    tc = (bc + 1 + int(r.integers(3))) % 4
    others = [c for c in range(4) if c not in (bc, tc)]
    blocks_c = [bc, tc] + others[: int(r.integers(0, 3))]
    targets_c = [tc, bc] + others[: int(r.integers(0, 2))]
    while True:
        targets, blocks, ok = [], [], True
        for c in targets_c:
            for _ in range(200):
                p = r.uniform(0.12, 0.88, 2)
                if all(apart(p, q, .2, .2, .02) for q, _ in targets):
                    break
            targets.append((p, c))
        for c in blocks_c:
            for _ in range(200):
                p = r.uniform(0.06, 0.94, 2)
                if all(apart(p, q, .08, .2, .02) for q, _ in targets) and all(apart(p, q, .08, .08, .04) for q, _ in blocks):
                    break
            else:
                ok = False
            blocks.append((p, c))
        if ok:
            break
    img = np.full((S, S, 3), 60, np.uint8)
    for p, c in targets:
        x0, y0, n = int(round((p[0] - .1) * S)), int(round((p[1] - .1) * S)), int(round(.2 * S))
        img[y0:y0 + n, x0:x0 + n] = RGB[c]
        img[y0 + 1:y0 + n - 1, x0 + 1:x0 + n - 1] = 60
    for p, c in blocks:
        x0, y0, n = int(round((p[0] - .04) * S)), int(round((p[1] - .04) * S)), int(round(.08 * S))
        img[y0:y0 + n, x0:x0 + n] = RGB[c]
    g = r.uniform(0.05, 0.95, 2)
    cx, cy = int(g[0] * S), int(g[1] * S)
    for d in range(-2, 3):
        if 0 <= cy + d < S:
            img[cy + d, cx] = 255
        if 0 <= cx + d < S:
            img[cy, cx + d] = 255
    to_bin = lambda v: int(min(BINS - 1, max(0, v * BINS)))
    bp = next(p for p, c in blocks if c == bc)
    tp = next(p for p, c in targets if c == tc)
    named = [to_bin(bp[0]), to_bin(bp[1]), to_bin(tp[0]), to_bin(tp[1])]
    every = [-1] * 16
    for p, c in blocks:
        every[4 * c], every[4 * c + 1] = to_bin(p[0]), to_bin(p[1])
    for p, c in targets:
        every[4 * c + 2], every[4 * c + 3] = to_bin(p[0]), to_bin(p[1])
    return img, bc, tc, named, every


def make(n, seed, args):
    r = np.random.default_rng(seed)
    images, tokens, labels = [], [], []
    for _ in range(n):
        img, bc, tc, named, every = scene(r, args.fixed_colour)
        images.append(img)
        words = [1, 2, 6 + bc, 3, 4, 2, 6 + tc, 5]  # put the <c> block on the <c> target
        lab = []
        if args.scene_queries:
            words += list(range(52, 68))
            lab += [v + BIN0 if v >= 0 else -100 for v in every]
        tokens.append(words + [10, 11, 12, 13])
        labels.append(lab + [v + BIN0 for v in named])
    im = torch.tensor(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return im, torch.tensor(tokens), torch.tensor(labels)


class Block(nn.Module):
    def __init__(self, w, heads, mlp, norm):
        super().__init__()
        self.heads, self.n1, self.n2 = heads, norm(w), norm(w)
        self.qkv, self.o = nn.Linear(w, 3 * w), nn.Linear(w, w)
        self.f1, self.f2 = nn.Linear(w, mlp), nn.Linear(mlp, w)

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, w))
        return x + self.f2(F.gelu(self.f1(self.n2(x)), approximate="tanh"))


def sincos2d(side, d):
    idx = torch.arange(side * side).double()
    x, y = (idx % side)[:, None], (idx // side)[:, None]
    omega = 10000.0 ** (-torch.arange(d // 4).double() / (d // 4))
    return torch.cat([torch.sin(x * omega), torch.cos(x * omega), torch.sin(y * omega), torch.cos(y * omega)], 1).float()


class Prefix(nn.Module):
    def __init__(self, init, posemb):
        super().__init__()
        hv, w = 64, 96
        self.patch = nn.Conv2d(3, hv, P, P)
        self.pos = nn.Parameter(torch.zeros((S // P) ** 2, hv))
        self.vit = nn.ModuleList([Block(hv, 16, 128, nn.LayerNorm) for _ in range(2)])
        self.post, self.proj = nn.LayerNorm(hv), nn.Linear(hv, w)
        self.emb = nn.Embedding(68, w)
        self.lm = nn.ModuleList([Block(w, 8, 192, nn.RMSNorm) for _ in range(3)])
        self.norm, self.w = nn.RMSNorm(w), w
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # fan_in: the elements of one output row
                nn.init.normal_(p, std=1 / math.sqrt(p[0].numel()) if init == "fan_in" else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        if posemb == "sincos2d":
            self.pos.data.copy_(sincos2d(S // P, hv))

    def forward(self, im, tok, queries):
        x = self.patch(im).flatten(2).transpose(1, 2) + self.pos
        for b in self.vit:
            x = b(x)
        h = torch.cat([self.proj(self.post(x)), self.emb(tok) * math.sqrt(self.w)], 1)
        for b in self.lm:
            h = b(h)
        return self.norm(h[:, -queries:]) @ self.emb.weight.t()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", choices=["normal", "fan_in"], default="normal")
    ap.add_argument("--posemb", choices=["normal", "sincos2d"], default="normal")
    ap.add_argument("--scene-queries", action="store_true")
    ap.add_argument("--fixed-colour", action="store_true", help="the named block is always red")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ti, tt, tl = make(20000, 1, args)
    vi, vt, vl = make(512, 2, args)
    torch.manual_seed(0)
    m = Prefix(args.init, args.posemb)
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.01)
    q = tl.size(1)
    t0 = time.time()
    for it in range(args.steps + 1):
        if it % 500 == 0:
            with torch.no_grad():
                lg = m(vi, vt, q)
                named, want = lg[:, -4:], vl[:, -4:]
                ce = F.cross_entropy(named.reshape(-1, 68), want.reshape(-1)).item()
                near = ((named.argmax(-1) - want).abs() <= 1).float().mean(0).tolist()
                line = f"step {it}: named ce {ce:.3f}, within a bin (block x, y, target x, y) " + \
                       ", ".join(f"{a:.2f}" for a in near)
                if args.scene_queries:
                    ok = vl[:, :16] >= 0
                    hit = (((lg[:, :16].argmax(-1) - vl[:, :16]).abs() <= 1) & ok).sum() / ok.sum()
                    line += f"; scene queries within a bin {hit.item():.2f}"
                print(f"{line} ({time.time() - t0:.0f} s)", flush=True)
        idx = torch.randint(0, len(ti), (32,))
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (it + 1) / 200)
        loss = F.cross_entropy(m(ti[idx], tt[idx], q).reshape(-1, 68), tl[idx].reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()


if __name__ == "__main__":
    main()
