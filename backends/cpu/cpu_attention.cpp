// CpuOps' attention (backends/cpu/cpu_ops.h): a blocked fp32 attention kernel for grouped-query
// attention without a mask, with a bottom-right causal mask (keys >= queries) or with an additive
// fp32 mask broadcast to [b, hq, s, t] (added to each tile row after the scale, read through its
// strides). Queries, dout and o are read through their strides; o comes back sequence-major
// ([b, s, hq, dv] memory), dq head-major.
//
// One task per (batch, key/value head): the group's query heads are stacked as the rows of one
// matrix (r heads x a block of positions), so keys and values are read once per group, never
// copied per query head, and every GEMM has r times the rows a per-head kernel would give it.
// Query blocks skip the key blocks a causal mask hides; the key blocks of a row are folded in
// with an online softmax (FlashAttention's forward), so the scores held at once are one
// [rows, key block] tile per thread whatever the sequence length. The backward recomputes each
// tile's probabilities from the saved log-sum-exp and accumulates dK and dV of its own key/value
// head (the task owns them: no atomics, no per-thread copies to sum), dQ per query block.
// GEMMs are the BLAS sgemm_ that libtorch_cpu exports (MKL's in the x86 wheel; ATen's cpublas
// wrappers are not exported), single-threaded inside the task (MKL runs one thread when called
// inside an OpenMP parallel region).
//
// Used for fp32 on the CPU when there are at least as many (batch, kv head) tasks as threads, and
// for bf16 the same way with its operands widened to fp32 by the caller (cpu_ops.cpp); otherwise
// ATen's flash kernel where it applies (no mask, causal with s == t, an fp32 additive mask), else
// the reference.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_attention.h"
#include "cpu_math.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace lf::backend::cpu_attention {
namespace {

// Row-major C[m, n] = alpha op(A) op(B) + beta C through column-major BLAS (C^T = op(B)^T op(A)^T:
// the same flags with the operands swapped). Tile sizes are far below 2^31.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char fa = ta ? 'T' : 'N', fb = tb ? 'T' : 'N';
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  sgemm_(&fb, &fa, &ni, &mi, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
}

struct Shape {
  int64_t b, hq, hkv, r, s, t, d, dv;
  bool causal;
  int64_t offset;  // causal: query i sees keys j <= i + offset (offset = t - s)
  int64_t bq;      // query positions per block (r * bq rows)
  int64_t bk;      // keys per block
};

Shape shape_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  Shape sh{};
  sh.b = q.size(0), sh.hq = q.size(1), sh.hkv = k.size(1), sh.r = sh.hq / sh.hkv;
  sh.s = q.size(2), sh.t = k.size(2), sh.d = q.size(3), sh.dv = v.size(3);
  sh.causal = causal;
  sh.offset = sh.t - sh.s;
  // About 128 rows per tile (the GEMMs' M), and at most 512 keys (the tile's N): a [128, 512]
  // fp32 tile is 256 KiB, within a core's L2 with the K/V block it reads.
  sh.bk = std::min<int64_t>(512, sh.t);
  sh.bq = std::max<int64_t>(8, 128 / sh.r);
  return sh;
}

// Keys a row at query position i may see: [0, limit(i)).
inline int64_t key_limit(const Shape& sh, int64_t i) { return sh.causal ? std::min(sh.t, i + sh.offset + 1) : sh.t; }

// A [b, h, s, w] operand read (or written) by rows: element (bi, h, i, e) at
// p + bi sb + h sh + i ss + e (its last dim unit-stride; the other strides as the caller's
// tensor has them, e.g. queries as a transposed view of [b, s, hq, d] memory).
struct Rows {
  float* p;
  int64_t sb, sh, ss;
  explicit Rows(const at::Tensor& t)
      : p(const_cast<float*>(t.data_ptr<float>())), sb(t.stride(0)), sh(t.stride(1)), ss(t.stride(2)) {}
  float* row(int64_t bi, int64_t h, int64_t i) const { return p + bi * sb + h * sh + i * ss; }
};

// Packs rows [i0, i0 + nq) of the r query heads of group g (head-major: row = j * nq + p) into
// dst[r * nq, w]; unpack is the inverse.
void pack(const Rows& src, float* dst, const Shape& sh, int64_t bi, int64_t g, int64_t i0, int64_t nq, int64_t w) {
  for (int64_t j = 0; j < sh.r; ++j) {
    if (src.ss == w) {  // the head's positions are adjacent: one copy
      std::memcpy(dst + j * nq * w, src.row(bi, g * sh.r + j, i0), sizeof(float) * nq * w);
      continue;
    }
    for (int64_t p = 0; p < nq; ++p)
      std::memcpy(dst + (j * nq + p) * w, src.row(bi, g * sh.r + j, i0 + p), sizeof(float) * w);
  }
}
void unpack(const float* src, const Rows& dst, const Shape& sh, int64_t bi, int64_t g, int64_t i0, int64_t nq,
            int64_t w) {
  for (int64_t j = 0; j < sh.r; ++j) {
    if (dst.ss == w) {
      std::memcpy(dst.row(bi, g * sh.r + j, i0), src + j * nq * w, sizeof(float) * nq * w);
      continue;
    }
    for (int64_t p = 0; p < nq; ++p)
      std::memcpy(dst.row(bi, g * sh.r + j, i0 + p), src + (j * nq + p) * w, sizeof(float) * w);
  }
}

// The additive mask as [b, hq, s, t] strides (broadcast dims stride 0, keys unit-stride); none
// when undefined. Added to a tile row after the scale, as SDPA adds attn_mask.
struct MaskRows {
  const float* p = nullptr;
  int64_t sb = 0, sh = 0, ss = 0;
  at::Tensor held;
  MaskRows(const at::Tensor& m, const Shape& shape) {
    if (!m.defined()) return;
    held = m.to(at::kFloat).expand({shape.b, shape.hq, shape.s, shape.t});
    if (held.stride(3) != 1) held = held.contiguous();
    p = held.data_ptr<float>(), sb = held.stride(0), sh = held.stride(1), ss = held.stride(2);
  }
  void add(float* z, int64_t bi, int64_t h, int64_t i, int64_t c0, int64_t n) const {
    if (!p) return;
    cpu_math::add_row(z, p + bi * sb + h * sh + i * ss + c0, n);
  }
};

// Unit-stride rows: the tensor itself when its last dim is, else a contiguous copy.
at::Tensor unit_rows(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

}  // namespace

bool shape_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  if (!q.device().is_cpu()) return false;
  if (causal && k.size(2) < q.size(2)) return false;  // rows without keys: the reference's answer
  if (q.size(2) == 0 || k.size(2) == 0 || q.size(3) == 0 || v.size(3) == 0) return false;  // empty: the reference
  return q.size(0) * k.size(1) >= at::get_num_threads();
}

Forward forward(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& mask,
                bool causal, double scale) {
  const at::Tensor q = unit_rows(q0), k = k0.contiguous(), v = v0.contiguous();
  const Shape sh = shape_of(q, k, v, causal);
  const MaskRows mr(mask, sh);
  // o is [b, hq, s, dv] in sequence-major memory ([b, s, hq, dv], what ATen's flash kernels return
  // and lf::ops::sdpa hands on) whatever the inputs' layout: what follows it (and its rounding)
  // does not depend on how the caller laid out q.
  at::Tensor o = at::empty({sh.b, sh.s, sh.hq, sh.dv}, q.options()).transpose(1, 2);
  at::Tensor lse = at::empty({sh.b, sh.hq, sh.s}, q.options());
  const Rows qr(q), orow(o);
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  const float alpha = static_cast<float>(scale);
  const int64_t rows = sh.r * sh.bq;
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, sh.b * sh.hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qb(rows * sh.d), tile(rows * sh.bk), acc(rows * sh.dv), m(rows), l(rows);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bi = task / sh.hkv, g = task % sh.hkv;
      const float* kg = kp + task * sh.t * sh.d;
      const float* vg = vp + task * sh.t * sh.dv;
      for (int64_t i0 = 0; i0 < sh.s; i0 += sh.bq) {
        const int64_t nq = std::min(sh.bq, sh.s - i0), nr = sh.r * nq;
        pack(qr, qb.data(), sh, bi, g, i0, nq, sh.d);
        std::fill(m.begin(), m.begin() + nr, kNone);
        std::fill(l.begin(), l.begin() + nr, 0.0f);
        std::fill(acc.begin(), acc.begin() + nr * sh.dv, 0.0f);
        const int64_t kend = key_limit(sh, i0 + nq - 1);
        for (int64_t c0 = 0; c0 < kend; c0 += sh.bk) {
          const int64_t kb = std::min(sh.bk, kend - c0);
          gemm(false, true, nr, kb, sh.d, alpha, qb.data(), sh.d, kg + c0 * sh.d, sh.d, 0.0f, tile.data(), kb);
          for (int64_t row = 0; row < nr; ++row) {
            float* z = tile.data() + row * kb;
            const int64_t pos = i0 + row % nq;
            const int64_t n = std::clamp<int64_t>(key_limit(sh, pos) - c0, 0, kb);
            mr.add(z, bi, g * sh.r + row / nq, pos, c0, n);
            const float mx = n == 0 ? kNone : std::max(m[row], cpu_math::row_max(z, n));
            if (mx == kNone) {  // every key so far is in this row's future or masked by -inf
              std::fill(z, z + kb, 0.0f);
              continue;
            }
            const float sum = static_cast<float>(cpu_math::row_exp_sum(z, mx, n));
            std::fill(z + n, z + kb, 0.0f);
            const float corr = m[row] == kNone ? 0.0f : std::exp(m[row] - mx);
            if (corr != 1.0f) {
              float* a = acc.data() + row * sh.dv;
              for (int64_t e = 0; e < sh.dv; ++e) a[e] *= corr;
            }
            l[row] = l[row] * corr + sum;
            m[row] = mx;
          }
          gemm(false, false, nr, sh.dv, kb, 1.0f, tile.data(), kb, vg + c0 * sh.dv, sh.dv, 1.0f, acc.data(), sh.dv);
        }
        for (int64_t row = 0; row < nr; ++row) {
          // A row without a visible key (an all -inf mask row): 0 / 0, as the reference's softmax.
          const float inv = 1.0f / l[row];
          float* a = acc.data() + row * sh.dv;
          for (int64_t e = 0; e < sh.dv; ++e) a[e] *= inv;
          const int64_t j = row / nq, p = row % nq;
          lp[(bi * sh.hq + g * sh.r + j) * sh.s + i0 + p] = m[row] + std::log(l[row]);
        }
        unpack(acc.data(), orow, sh, bi, g, i0, nq, sh.dv);
      }
    }
  });
  return {o, lse};
}

Backward backward(const at::Tensor& dout0, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                  const at::Tensor& o0, const at::Tensor& lse0, const at::Tensor& mask, bool causal, double scale) {
  const at::Tensor q = unit_rows(q0), k = k0.contiguous(), v = v0.contiguous();
  const at::Tensor dout = unit_rows(dout0.to(at::kFloat)), o = unit_rows(o0.to(at::kFloat));
  const at::Tensor lse = lse0.to(at::kFloat).contiguous();
  const Shape sh = shape_of(q, k, v, causal);
  const MaskRows mr(mask, sh);
  at::Tensor dq = at::empty({sh.b, sh.hq, sh.s, sh.d}, q.options()), dk = at::zeros_like(k), dv = at::zeros_like(v);
  const Rows qr(q), dor(dout), orow(o), dqr(dq);
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>(), *lp = lse.data_ptr<float>();
  float *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  const float alpha = static_cast<float>(scale);
  const int64_t rows = sh.r * sh.bq;
  at::parallel_for(0, sh.b * sh.hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qb(rows * sh.d), dob(rows * sh.dv), ob(rows * sh.dv), dqb(rows * sh.d);
    std::vector<float> p(rows * sh.bk), dp(rows * sh.bk), lrow(rows), drow(rows);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bi = task / sh.hkv, g = task % sh.hkv;
      const float* kg = kp + task * sh.t * sh.d;
      const float* vg = vp + task * sh.t * sh.dv;
      float* dkg = dkp + task * sh.t * sh.d;
      float* dvg = dvp + task * sh.t * sh.dv;
      for (int64_t i0 = 0; i0 < sh.s; i0 += sh.bq) {
        const int64_t nq = std::min(sh.bq, sh.s - i0), nr = sh.r * nq;
        pack(qr, qb.data(), sh, bi, g, i0, nq, sh.d);
        pack(dor, dob.data(), sh, bi, g, i0, nq, sh.dv);
        pack(orow, ob.data(), sh, bi, g, i0, nq, sh.dv);
        for (int64_t row = 0; row < nr; ++row) {
          const int64_t j = row / nq, pos = row % nq;
          lrow[row] = lp[(bi * sh.hq + g * sh.r + j) * sh.s + i0 + pos];
          // D = rowsum(dO * O) of the given O (a block of a larger attention gets its share).
          drow[row] = static_cast<float>(cpu_math::dot(dob.data() + row * sh.dv, ob.data() + row * sh.dv, sh.dv));
        }
        const int64_t kend = key_limit(sh, i0 + nq - 1);
        for (int64_t c0 = 0; c0 < kend; c0 += sh.bk) {
          const int64_t kb = std::min(sh.bk, kend - c0);
          gemm(false, true, nr, kb, sh.d, alpha, qb.data(), sh.d, kg + c0 * sh.d, sh.d, 0.0f, p.data(), kb);
          for (int64_t row = 0; row < nr; ++row) {  // P = exp(S + mask - lse), 0 where causally hidden
            float* z = p.data() + row * kb;
            const int64_t pos = i0 + row % nq;
            const int64_t n = std::clamp<int64_t>(key_limit(sh, pos) - c0, 0, kb);
            mr.add(z, bi, g * sh.r + row / nq, pos, c0, n);
            if (n > 0) cpu_math::row_exp_sum(z, lrow[row], n);
            std::fill(z + n, z + kb, 0.0f);
          }
          // dV += P^T dO;  dP = dO V^T;  dS = P (dP - D);  dQ += scale dS K;  dK += scale dS^T Q
          gemm(true, false, kb, sh.dv, nr, 1.0f, p.data(), kb, dob.data(), sh.dv, 1.0f, dvg + c0 * sh.dv, sh.dv);
          gemm(false, true, nr, kb, sh.dv, 1.0f, dob.data(), sh.dv, vg + c0 * sh.dv, sh.dv, 0.0f, dp.data(), kb);
          for (int64_t row = 0; row < nr; ++row) {
            cpu_math::softmax_grad_row(p.data() + row * kb, dp.data() + row * kb, drow[row], kb);
          }
          gemm(false, false, nr, sh.d, kb, alpha, dp.data(), kb, kg + c0 * sh.d, sh.d, c0 == 0 ? 0.0f : 1.0f,
               dqb.data(), sh.d);
          gemm(true, false, kb, sh.d, nr, alpha, dp.data(), kb, qb.data(), sh.d, 1.0f, dkg + c0 * sh.d, sh.d);
        }
        unpack(dqb.data(), dqr, sh, bi, g, i0, nq, sh.d);
      }
    }
  });
  return {dq, dk, dv};
}

}  // namespace lf::backend::cpu_attention
