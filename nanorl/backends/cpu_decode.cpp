// CPU kernels for nanorl's decode step (backends/decode.py), fp32: everything in a decoder layer that is not a
// matmul, for one new token per row. Built once per machine with torch.utils.cpp_extension (a C++ compiler
// and ninja), registered as torch.ops.nanorl_cpu.*; tests/test_decode.py checks each against plain PyTorch.
//
//   decode_attention  rotary on the new query/key heads, the key and value written into the row's completion
//                     cache, then grouped-query attention over the group's shared prompt cache and the row's
//                     completion cache (no per-row copy of the prompt, no torch.cat of a growing cache)
//   silu_mul          SiLU(gate) * up of the fused gate/up projection
//   rms_norm          RMSNorm of each row
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <cmath>
#include <vector>

namespace {

constexpr int LANES = 16;

// exp(x) in float, ~2 ulp, clamped to [-87, 88]: 2^k * p(r), x = k ln2 + r, |r| <= ln2 / 2,
// p a degree-6 Taylor polynomial.
// Plain arithmetic, so loops over it vectorize (glibc's expf is a scalar call): 10x faster softmax and SiLU here.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // exp(-87) ~ 2e-38 > 0, exp(88) < FLT_MAX
  const float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float r = (x - k * 0.693145752f) - k * 1.42860677e-6f;   // ln 2 split in two for precision
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f +
                                                              r * (0.00833333333f + r * 0.00138888889f)))));
  union { float f; int32_t i; } s;
  s.i = (static_cast<int32_t>(k) + 127) << 23;
  return p * s.f;
}


// out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[d/2:], x[:d/2])  (Su et al., arXiv 2104.09864)
inline void rope(const float* x, const float* c, const float* s, float* out, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t e = 0; e < h; ++e) out[e] = x[e] * c[e] - x[e + h] * s[e];
  for (int64_t e = h; e < d; ++e) out[e] = x[e] * c[e] + x[e - h] * s[e];
}


// LANES floats as one value (GCC/Clang vector extension): plain arithmetic on it compiles to SIMD.
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
inline vec load(const float* p) { vec v; __builtin_memcpy(&v, p, sizeof v); return v; }

// out[u] = q . k[:, u] for u < len, keys transposed: k (d, stride), readable LANES - 1 columns past len.
inline void scores(const float* q, const float* k, int64_t stride, int64_t len, int64_t d, float* out) {
  for (int64_t u0 = 0; u0 < len; u0 += LANES) {
    vec acc = {};
    for (int64_t e = 0; e < d; ++e) acc += q[e] * load(k + e * stride + u0);
    const int64_t w = len - u0 < LANES ? len - u0 : LANES;
    for (int64_t l = 0; l < w; ++l) out[u0 + l] = acc[l];
  }
}

inline float max_of(const float* x, int64_t n) {
  float r = x[0];
  for (int64_t u = 1; u < n; ++u) r = x[u] > r ? x[u] : r;
  return r;
}

inline float exp_sum(float* x, int64_t n, float shift) {  // x <- exp(x - shift), returns the sum
  for (int64_t u = 0; u < n; ++u) x[u] = exp_approx(x[u] - shift);
  float s[LANES] = {0};
  int64_t u = 0;
  for (; u + LANES <= n; u += LANES)
    for (int l = 0; l < LANES; ++l) s[l] += x[u + l];
  float r = 0;
  for (; u < n; ++u) r += x[u];
  for (int l = 0; l < LANES; ++l) r += s[l];
  return r;
}

// One new token per row: rotary on its query and key heads, its key and value written at completion slot t,
// then softmax(q K^T * scale) V over the row's prompt (shared by the n rows of a group, from position
// start[prompt] on: left padding) and its completion slots 0..t. Keys are stored transposed, (d, L), so
// scores for consecutive positions are one vector. qkv (A, (nh + 2 nkv) d) -> (A, nh d).
at::Tensor decode_attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& kpt, const at::Tensor& vp, const at::Tensor& kct,
                            const at::Tensor& vc, const at::Tensor& rows, const at::Tensor& start,
                            int64_t n, int64_t t, int64_t num_heads, double scale) {
  TORCH_CHECK(qkv.is_contiguous() && kpt.is_contiguous() && vp.is_contiguous() && kct.is_contiguous() &&
              vc.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() && rows.is_contiguous() &&
              start.is_contiguous(), "decode_attention: contiguous inputs");
  const int64_t A = qkv.size(0), nkv = vc.size(1), C = vc.size(2), d = vc.size(3), Lp = vp.size(2);
  const int64_t G = num_heads / nkv, width = (num_heads + 2 * nkv) * d, KS = kpt.size(3), CS = kct.size(3);
  TORCH_CHECK(qkv.size(1) == width && t < C && CS >= C + LANES - 1 && KS >= Lp + LANES - 1, "decode_attention: shapes");
  auto out = at::empty({A, num_heads * d}, qkv.options());
  const float *Q = qkv.data_ptr<float>(), *CO = cos.data_ptr<float>(), *SI = sin.data_ptr<float>();
  const float *KP = kpt.data_ptr<float>(), *VP = vp.data_ptr<float>();
  float *KC = kct.data_ptr<float>(), *VC = vc.data_ptr<float>(), *O = out.data_ptr<float>();
  const int64_t *R = rows.data_ptr<int64_t>(), *S = start.data_ptr<int64_t>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, A * nkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> q(G * d), k(d), p(G * (Lp + C));
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t i = task / nkv, h = task % nkv, row = R[i], pr = row / n;
      const float *x = Q + i * width, *c = CO + i * d, *s = SI + i * d;
      float* kc = KC + (row * nkv + h) * d * CS;  // (d, CS)
      float* vc = VC + (row * nkv + h) * C * d;  // (C, d)
      rope(x + (num_heads + h) * d, c, s, k.data(), d);
      for (int64_t e = 0; e < d; ++e) kc[e * CS + t] = k[e];
      const float* v = x + (num_heads + nkv + h) * d;
      for (int64_t e = 0; e < d; ++e) vc[t * d + e] = v[e];
      for (int64_t j = 0; j < G; ++j) {
        rope(x + (h * G + j) * d, c, s, q.data() + j * d, d);
        for (int64_t e = 0; e < d; ++e) q[j * d + e] *= sc;
      }
      const int64_t s0 = S[pr], np = Lp - s0, L = np + t + 1;
      const float* kp = KP + (pr * nkv + h) * d * KS + s0;  // (d, KS) from column s0
      const float* vp = VP + ((pr * nkv + h) * Lp + s0) * d;  // (Lp, d) from row s0
      for (int64_t j = 0; j < G; ++j) {  // scores, LANES positions at a time kept in registers
        const float* qj = q.data() + j * d;
        float* pj = p.data() + j * L;
        scores(qj, kp, KS, np, d, pj);
        scores(qj, kc, CS, t + 1, d, pj + np);
      }
      for (int64_t j = 0; j < G; ++j) {
        float* pj = p.data() + j * L;
        const float inv = 1.0f / exp_sum(pj, L, max_of(pj, L));
        float* o = O + i * num_heads * d + (h * G + j) * d;
        for (int64_t e = 0; e < d; ++e) o[e] = 0;
        for (int64_t u = 0; u < L; ++u) {
          const float* vv = u < np ? vp + u * d : vc + (u - np) * d;
          const float w = pj[u];
          for (int64_t e = 0; e < d; ++e) o[e] += w * vv[e];
        }
        for (int64_t e = 0; e < d; ++e) o[e] *= inv;
      }
    }
  });
  return out;
}

// silu(gate) * up for gu = [gate | up] (M, 2I) -> (M, I)  (Shazeer, arXiv 2002.05202)
at::Tensor silu_mul(const at::Tensor& gu) {
  TORCH_CHECK(gu.is_contiguous() && gu.dim() == 2, "silu_mul: a contiguous (M, 2I) tensor");
  const int64_t M = gu.size(0), I = gu.size(1) / 2;
  auto out = at::empty({M, I}, gu.options());
  const float* X = gu.data_ptr<float>();
  float* Y = out.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t e = 0; e < I; ++e) {
        const float g = X[r * 2 * I + e];
        Y[r * I + e] = g / (1.0f + exp_approx(-g)) * X[r * 2 * I + I + e];
      }
  });
  return out;
}

// w * x / sqrt(mean(x^2) + eps) for each row of x (M, H)  (RMSNorm, Zhang & Sennrich, arXiv 1910.07467)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.dim() == 2 && w.numel() == x.size(1), "rms_norm: shapes");
  const int64_t M = x.size(0), H = x.size(1);
  auto out = at::empty({M, H}, x.options());
  const float *X = x.data_ptr<float>(), *W = w.data_ptr<float>();
  float* Y = out.data_ptr<float>();
  at::parallel_for(0, M, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = X + r * H;
      vec acc = {};
      int64_t e = 0;
      for (; e + LANES <= H; e += LANES) { const vec v = load(xr + e); acc += v * v; }
      float ss = 0;
      for (; e < H; ++e) ss += xr[e] * xr[e];
      for (int l = 0; l < LANES; ++l) ss += acc[l];
      const float inv = 1.0f / std::sqrt(ss / H + static_cast<float>(eps));
      for (e = 0; e < H; ++e) Y[r * H + e] = W[e] * (xr[e] * inv);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(nanorl_cpu, m) {
  m.def("decode_attention(Tensor qkv, Tensor cos, Tensor sin, Tensor kpt, Tensor vp, Tensor(a!) kct, Tensor(b!) vc, "
        "Tensor rows, Tensor start, int n, int t, int num_heads, float scale) -> Tensor");
  m.def("silu_mul(Tensor gu) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
}
TORCH_LIBRARY_IMPL(nanorl_cpu, CPU, m) {
  m.impl("decode_attention", decode_attention);
  m.impl("silu_mul", silu_mul);
  m.impl("rms_norm", rms_norm);
}
