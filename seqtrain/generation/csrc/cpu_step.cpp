// The compiled CPU decoding step of seqtrain's beam search (seqtrain/generation/cpu_step.py builds and loads it).
//
// Decoder: one call per step runs every layer of a BART decoder for the live rows: embedding, layer norms, the
// fused q/k/v product, attention over the key/value cache, cross-attention over the encoder's keys/values,
// the feed-forward block, the output projection. The matrix products go to the weights' backend (oneDNN's packed
// linear with its GELU / residual-add post-ops, or torch's dense or dynamic int8 linear) through the dispatcher;
// everything between them is a loop here, one pass per row, with no Python and no small ATen kernels.
//
// The cache is never gathered. Beam search reorders rows every step; instead of copying every layer's keys and
// values into the new order (what the eager step does, and CTranslate2), each time slice keeps the rows it was
// written with and a table `idx` says, for every live row and every earlier step, which row of that step holds
// its ancestor's keys and values. A reorder rewrites that table (steps x rows integers), not the cache
// (steps x rows x 2 x C floats per layer). Cross-attention keys and values stay per source sentence and every row
// knows its sentence, so sentences that leave the batch cost nothing either.
//
// beam_candidates: the candidate step of beam search in one pass per row, exact: log-softmax, the masks (pad,
// unk penalty, EOS below the min length, only EOS at the max length, repeated n-grams), the beam-score add and
// the top-k, without materializing the log-probabilities. Within a row the score of token v is
// prev + (x_v - max) - log(sum), a monotone function of x_v, so the row's top k tokens by x are its top k by
// score; a sentence's top k are then among its rows' top k.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

using at::Tensor;

// exp(x), in a form compilers vectorize (Cephes' expf: Cody-Waite reduction, degree-5 polynomial; ~1 ulp over
// the float range). Below -87.3 it returns ~1e-38, not 0: callers skip masked (-inf) entries themselves.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.33654475f), 88.72283905f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The hand-vectorized kernels (AVX-512 builds) or the plain loops every build has; set_vector_kernels(false) lets
// the tests check the plain loops on a machine that would take the vector ones (an AVX2-only CPU runs them).
bool g_vector = true;

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3, int64_t n,
                 float* out) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float x = q[i];
    s0 += x * k0[i];
    s1 += x * k1[i];
    s2 += x * k2[i];
    s3 += x * k3[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

#if defined(__AVX512F__)
// The sums of 16 vectors, as one vector (lane i: the sum of acc[i]): a transposing tree of shuffles and adds,
// 45 operations where 16 horizontal sums would cost about 16 x 8 dependent ones.
inline __m512 sum16(const __m512* acc) {
  __m512 l1[8], l2[4];
  for (int i = 0; i < 8; ++i) {  // lane-wise [a b a b] partial sums of each pair
    const __m512 a = acc[2 * i], b = acc[2 * i + 1];
    l1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i) {  // [a b c d] in every 128-bit lane
    const __m512 a = l1[2 * i], b = l1[2 * i + 1];
    l2[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(l2[0], l2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(l2[0], l2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(l2[2], l2[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(l2[2], l2[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// out[i] = q . k[i] for 16 keys of n floats (n a multiple of 16)
inline void dot16(const float* q, const float* const* k, int64_t n, float* out) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 qv = _mm512_loadu_ps(q + j);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[i] + j), acc[i]);
  }
  _mm512_storeu_ps(out, sum16(acc));
}
#endif

// y[0..d) = sum over s < n of p[s] * row(s)[0..d): the attention's weighted sum of values
template <typename Row>
void weighted_rows(float* y, int64_t d, int64_t n, const float* p, Row&& row) {
  std::fill(y, y + d, 0.f);
  for (int64_t s = 0; s < n; ++s) {
    if (p[s] == 0.f) continue;
    const float w = p[s];
    const float* v = row(s);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) y[j] += w * v[j];
  }
}

// sc[s] = scale * sum over j < d of q[j] * kt[j * S + s], for s < S: a query against keys laid out d x S
inline void scores_transposed(float* sc, int64_t S, const float* q, int64_t d, const float* kt, float scale) {
  std::fill(sc, sc + S, 0.f);
  for (int64_t j = 0; j < d; ++j) {
    const float qj = q[j] * scale;
    const float* kj = kt + j * S;
#pragma omp simd
    for (int64_t s = 0; s < S; ++s) sc[s] += qj * kj[s];
  }
}

#if defined(__AVX512F__)
// The sums held in NV vector registers across all n rows (the generic loop stores y after every row).
template <int NV, typename Row>
void weighted_rows_v(float* y, int64_t n, const float* p, Row&& row) {
  __m512 acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t s = 0; s < n; ++s) {
    const __m512 w = _mm512_set1_ps(p[s]);
    const float* v = row(s);
    for (int c = 0; c < NV; ++c) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 16 * c), acc[c]);
  }
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(y + 16 * c, acc[c]);
}

template <typename Row>
bool weighted_rows_fast(float* y, int64_t d, int64_t n, const float* p, Row&& row) {
  switch (d) {
    case 16: weighted_rows_v<1>(y, n, p, row); return true;
    case 32: weighted_rows_v<2>(y, n, p, row); return true;
    case 64: weighted_rows_v<4>(y, n, p, row); return true;
    case 128: weighted_rows_v<8>(y, n, p, row); return true;
    default: return false;
  }
}

// scores_transposed with 64 positions at a time held in registers across the d products
inline void scores_transposed_v(float* sc, int64_t S, const float* q, int64_t d, const float* kt, float scale) {
  for (int64_t s0 = 0; s0 < S; s0 += 64) {
    __mmask16 m[4];
    for (int c = 0; c < 4; ++c) {
      const int64_t lo = s0 + 16 * c, left = S - lo;
      m[c] = left >= 16 ? static_cast<__mmask16>(0xFFFF)
             : left > 0 ? static_cast<__mmask16>((1u << left) - 1u)
                        : static_cast<__mmask16>(0);
    }
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t j = 0; j < d; ++j) {
      const __m512 qj = _mm512_set1_ps(q[j] * scale);
      const float* kj = kt + j * S + s0;
      for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(qj, _mm512_maskz_loadu_ps(m[c], kj + 16 * c), acc[c]);
    }
    for (int c = 0; c < 4; ++c) _mm512_mask_storeu_ps(sc + s0 + 16 * c, m[c], acc[c]);
  }
}
#endif

template <typename Row>
void attend_values(float* y, int64_t d, int64_t n, const float* p, Row&& row) {
#if defined(__AVX512F__)
  if (g_vector && weighted_rows_fast(y, d, n, p, row)) return;
#endif
  weighted_rows(y, d, n, p, row);
}

inline void attend_keys_transposed(float* sc, int64_t S, const float* q, int64_t d, const float* kt, float scale) {
#if defined(__AVX512F__)
  if (g_vector) return scores_transposed_v(sc, S, q, d, kt, scale);
#endif
  scores_transposed(sc, S, q, d, kt, scale);
}

// softmax of scores[0..n) in place, entries at -inf left out; returns nothing (the weights sum to 1)
inline void softmax_inplace(float* scores, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, scores[i]);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = scores[i] == -std::numeric_limits<float>::infinity() ? 0.f : fast_exp(scores[i] - m);
    scores[i] = e;
    sum += e;
  }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) scores[i] *= inv;
}

// y = LN(x) * w + b per row of C floats (x and y may alias)
void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t C, const float* w, const float* b, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * C;
      float* yr = y + r * C;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < C; ++i) sum += xr[i];
      const float mean = sum / static_cast<float>(C);
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t i = 0; i < C; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
      const float rstd = 1.f / std::sqrt(sq / static_cast<float>(C) + eps);
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
    }
  });
}

// ------------------------------------------------------------------------------------------------ products
enum Kind : int64_t { kOneDnn = 0, kDense = 1, kInt8 = 2 };
enum Act : int64_t { kNone = 0, kGelu = 1, kGeluTanh = 2, kRelu = 3 };

// One projection y = x W^T + b in the backend its weights were prepared for (cpu_step.py's PackedModel).
struct Linear {
  int64_t kind = kDense;
  Tensor weight;  // oneDNN: mkldnn::_reorder_linear_weight's packed tensor; dense: out x in
  c10::optional<Tensor> bias;
  c10::IValue packed;  // int8: quantized::linear_prepack's params (the bias inside)
  int64_t out = 0;
};

const c10::OperatorHandle& onednn_linear() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  return op;
}
const c10::OperatorHandle& onednn_linear_add() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "binary");
  return op;
}
const c10::OperatorHandle& int8_linear() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "");
  return op;
}

// The row count a product runs at (cpu_products.bucket_rows, the same rule): oneDNN keeps a primitive, with its
// generated code and buffers, per shape it has seen (its cache holds 1024), so a search whose row count falls
// one by one, batch after batch, grew a process by ~700 MiB (seqtrain-serve's soak); in buckets a process meets
// a few dozen shapes. Powers of two up to 8 rows (tiny products cost their weight's reading, whatever the rows),
// multiples of 8 up to 64, of 16 up to 256, then 8 buckets an octave (at most 12.5% more rows).
int64_t bucket_rows(int64_t m) {
  if (m <= 8) return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
  if (m <= 64) return (m + 7) / 8 * 8;
  if (m <= 256) return (m + 15) / 16 * 16;
  int64_t octave = 256;
  while (octave * 2 < m) octave *= 2;
  const int64_t step = octave / 8;
  return (m + step - 1) / step * step;
}

Tensor run_linear_rows(const Linear& lin, const Tensor& x, int64_t act, const Tensor* residual);

// act(x W^T + b) (+ residual): 2-D x (rows x in) -> rows x out. The rows run padded to their bucket for oneDNN
// (the last row repeated: a dynamic int8 product's quantization range stays the rows' own), the extra outputs
// dropped.
Tensor run_linear(const Linear& lin, const Tensor& x, int64_t act, const Tensor* residual) {
  const int64_t m = x.size(0), mb = bucket_rows(m);
  if (lin.kind == kDense || mb == m || m == 0) return run_linear_rows(lin, x, act, residual);
  Tensor xp = at::empty({mb, x.size(1)}, x.options());
  xp.narrow(0, 0, m).copy_(x);
  xp.narrow(0, m, mb - m).copy_(x.narrow(0, m - 1, 1).expand({mb - m, x.size(1)}));
  Tensor rp;
  if (residual != nullptr) {
    rp = at::empty({mb, residual->size(1)}, residual->options());
    rp.narrow(0, 0, m).copy_(*residual);
    rp.narrow(0, m, mb - m).zero_();
  }
  return run_linear_rows(lin, xp, act, residual != nullptr ? &rp : nullptr).narrow(0, 0, m);
}

// run_linear on the rows as given. oneDNN applies the activation or the residual add as a post-op of the
// product; the other backends as a pass after it (the same values as the eager step's separate ops: x + f(x) and
// f(x) + x are one float addition).
Tensor run_linear_rows(const Linear& lin, const Tensor& x, int64_t act, const Tensor* residual) {
  torch::jit::Stack s;
  if (lin.kind == kOneDnn) {
    if (residual != nullptr && act == kNone) {
      s = {x, *residual, lin.weight, lin.bias, std::string("add")};
      onednn_linear_add().callBoxed(&s);
      return s[0].toTensor();
    }
    if (act != kNone || residual == nullptr) {
      const char* attr = act == kRelu ? "relu" : (act == kNone ? "none" : "gelu");
      c10::IValue algorithm = act == kGeluTanh ? c10::IValue(std::string("tanh"))
                              : act == kGelu   ? c10::IValue(std::string("none"))
                                               : c10::IValue(std::string(""));
      s = {x, lin.weight, lin.bias, std::string(attr), c10::List<c10::optional<at::Scalar>>(), algorithm};
      onednn_linear().callBoxed(&s);
      Tensor y = s[0].toTensor();
      if (residual != nullptr) y.add_(*residual);
      return y;
    }
  }
  Tensor y;
  if (lin.kind == kInt8) {
    // reduce_range: 7-bit activations, as seqtrain.models.int8.Int8Linear (AVX2's 16-bit pairs cannot saturate)
    s = {x, lin.packed, true};
    int8_linear().callBoxed(&s);
    y = s[0].toTensor();
  } else {
    y = at::linear(x, lin.weight, lin.bias);
  }
  if (act == kGelu) {
    y = at::gelu(y, "none");
  } else if (act == kGeluTanh) {
    y = at::gelu(y, "tanh");
  } else if (act == kRelu) {
    y.relu_();
  }
  if (residual != nullptr) y.add_(*residual);
  return y;
}

// ------------------------------------------------------------------------------------------------ decoder
struct LayerNorm {
  Tensor w, b;
  float eps = 1e-5f;
  void apply(const Tensor& x, Tensor& y) const {
    layer_norm_rows(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), w.data_ptr<float>(),
                    b.data_ptr<float>(), eps);
  }
  Tensor operator()(const Tensor& x) const {
    Tensor y = at::empty_like(x);
    apply(x, y);
    return y;
  }
};

// Where a step's time goes (Decoder.profile(), for scripts/bench/profile_beam_search.py): off unless asked.
enum Section : int { kEmbed, kNorms, kProducts, kSelfAttention, kCrossAttention, kOutput, kSections };
constexpr const char* kSectionNames[kSections] = {"embedding", "layer norms", "layer products",
                                                  "self-attention", "cross-attention", "output projection"};

struct Timer {
  std::array<double, kSections>* acc;
  int section;
  std::chrono::steady_clock::time_point start;
  Timer(std::array<double, kSections>* a, int sec)
      : acc(a), section(sec), start(a ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point()) {}
  ~Timer() {
    if (acc) (*acc)[section] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

struct Layer {
  Linear qkv, out, cross_q, cross_kv, cross_out, fc1, fc2;
  LayerNorm self_norm, cross_norm, ffn_norm;
};

class Decoder {
 public:
  Decoder(int64_t heads, bool pre_norm, int64_t act, double embed_scale, Tensor embed, Tensor positions,
          Tensor emb_norm_w, Tensor emb_norm_b, double emb_norm_eps, c10::optional<Tensor> final_norm_w,
          c10::optional<Tensor> final_norm_b, double final_norm_eps, Linear output)
      : heads_(heads),
        pre_norm_(pre_norm),
        act_(act),
        embed_scale_(static_cast<float>(embed_scale)),
        embed_(embed.contiguous()),
        positions_(positions.contiguous()),
        emb_norm_{emb_norm_w.contiguous(), emb_norm_b.contiguous(), static_cast<float>(emb_norm_eps)},
        output_(std::move(output)) {
    has_final_norm_ = final_norm_w.has_value();
    if (has_final_norm_) {
      final_norm_ = {final_norm_w->contiguous(), final_norm_b->contiguous(), static_cast<float>(final_norm_eps)};
    }
    dim_ = embed_.size(1);
    TORCH_CHECK(dim_ % heads_ == 0, "decoder width ", dim_, " is not a multiple of ", heads_, " heads");
  }

  void add_layer(Linear qkv, Linear out, Linear cross_q, Linear cross_kv, Linear cross_out, Linear fc1, Linear fc2,
                 Tensor n1w, Tensor n1b, double e1, Tensor n2w, Tensor n2b, double e2, Tensor n3w, Tensor n3b,
                 double e3) {
    Layer l;
    l.qkv = std::move(qkv);
    l.out = std::move(out);
    l.cross_q = std::move(cross_q);
    l.cross_kv = std::move(cross_kv);
    l.cross_out = std::move(cross_out);
    l.fc1 = std::move(fc1);
    l.fc2 = std::move(fc2);
    l.self_norm = {n1w.contiguous(), n1b.contiguous(), static_cast<float>(e1)};
    l.cross_norm = {n2w.contiguous(), n2b.contiguous(), static_cast<float>(e2)};
    l.ffn_norm = {n3w.contiguous(), n3b.contiguous(), static_cast<float>(e3)};
    layers_.push_back(std::move(l));
  }

  // A batch: the encoder output `memory` (B x S x C, float), which of its positions are real (B x S bool), the
  // sentence of each row of the first step (R0), and the most rows any step will have.
  void begin(const Tensor& memory, const Tensor& valid, const Tensor& row_sent, int64_t max_rows) {
    TORCH_CHECK(memory.dim() == 3 && memory.scalar_type() == at::kFloat, "memory must be B x S x C float");
    sentences_ = memory.size(0);
    src_len_ = memory.size(1);
    valid_ = valid.to(at::kBool).contiguous();
    const Tensor flat = memory.reshape({sentences_ * src_len_, memory.size(2)}).contiguous();
    memory_keys_.clear();
    memory_values_.clear();
    const int64_t H = heads_, d = dim_ / heads_;
    for (const Layer& l : layers_) {
      // keys as B x H x d x S (a query's scores are then vector products over the positions) and values as
      // B x H x S x d (its output a sum of rows): each sentence's block read once per row, no horizontal sums
      const Tensor kv = run_linear(l.cross_kv, flat, kNone, nullptr).view({sentences_, src_len_, 2, H, d});
      memory_keys_.push_back(kv.select(2, 0).permute({0, 2, 3, 1}).contiguous());
      memory_values_.push_back(kv.select(2, 1).permute({0, 2, 1, 3}).contiguous());
    }
    const Tensor rs = row_sent.to(at::kLong).contiguous();
    row_sent_.assign(rs.data_ptr<int64_t>(), rs.data_ptr<int64_t>() + rs.numel());
    rows_ = static_cast<int64_t>(row_sent_.size());
    rcap_ = std::max(max_rows, rows_);
    steps_ = 0;
    tcap_ = 0;
    cache_.assign(layers_.size(), Tensor());
    idx_.clear();
  }

  // One step for the live rows: `tokens` (R, the last token of each row), `position` the positional
  // embedding's row. Returns the logits, R x V.
  Tensor step(const Tensor& tokens, int64_t position) {
    const int64_t R = tokens.size(0);
    TORCH_CHECK(R == rows_, "step: ", R, " rows given, the decoder holds ", rows_);
    TORCH_CHECK(position >= 0 && position < positions_.size(0), "position ", position, " out of range");
    grow(steps_ + 1);
    int32_t* slot = idx_.data() + steps_ * rcap_;
    for (int64_t r = 0; r < R; ++r) slot[r] = static_cast<int32_t>(r);

    Tensor x;
    {
      Timer tm(timers(), kEmbed);
      x = embed(tokens.to(at::kLong).contiguous(), position);
    }
    for (size_t i = 0; i < layers_.size(); ++i) x = layer(i, x);
    if (has_final_norm_) {
      Timer tm(timers(), kNorms);
      final_norm_.apply(x, x);
    }
    steps_ += 1;
    Timer tm(timers(), kOutput);
    return run_linear(output_, x, kNone, nullptr);
  }

  void set_profiling(bool on) {
    profiling_ = on;
    prof_.fill(0.0);
  }
  std::vector<std::pair<std::string, double>> profile() const {
    std::vector<std::pair<std::string, double>> out;
    for (int i = 0; i < kSections; ++i) out.emplace_back(kSectionNames[i], prof_[i]);
    return out;
  }

  // The rows of the next step come from rows `new_order` of the last one.
  void reorder(const Tensor& new_order) {
    const Tensor order = new_order.to(at::kLong).contiguous();
    const int64_t* o = order.data_ptr<int64_t>();
    const int64_t R = order.numel();
    TORCH_CHECK(R <= rcap_, "reorder: ", R, " rows, capacity ", rcap_);
    std::vector<int32_t> tmp(R);
    for (int64_t s = 0; s < steps_; ++s) {
      int32_t* row = idx_.data() + s * rcap_;
      for (int64_t r = 0; r < R; ++r) {
        TORCH_CHECK(o[r] >= 0 && o[r] < rows_, "reorder: row ", o[r], " of ", rows_);
        tmp[r] = row[o[r]];
      }
      std::copy(tmp.begin(), tmp.end(), row);
    }
    std::vector<int64_t> sent(R);
    for (int64_t r = 0; r < R; ++r) sent[r] = row_sent_[o[r]];
    row_sent_ = std::move(sent);
    rows_ = R;
  }

  int64_t rows() const { return rows_; }
  int64_t steps() const { return steps_; }

 private:
  Tensor embed(const Tensor& tokens, int64_t position) {
    const int64_t R = tokens.size(0), C = dim_;
    Tensor x = at::empty({R, C}, embed_.options());
    const float* E = embed_.data_ptr<float>();
    const float* P = positions_.data_ptr<float>() + position * C;
    const int64_t* tok = tokens.data_ptr<int64_t>();
    float* xp = x.data_ptr<float>();
    const int64_t V = embed_.size(0);
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(tok[r] >= 0 && tok[r] < V, "token ", tok[r], " is not in the vocabulary");
      const float* e = E + tok[r] * C;
      float* xr = xp + r * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) xr[i] = embed_scale_ * e[i] + P[i];
    }
    emb_norm_.apply(x, x);
    return x;
  }

  std::array<double, kSections>* timers() { return profiling_ ? &prof_ : nullptr; }

  // the sublayer's input: the layer norm of x before it (pre-norm), x itself (post-norm)
  Tensor norm_in(const LayerNorm& n, const Tensor& x) {
    if (!pre_norm_) return x;
    Timer tm(timers(), kNorms);
    return n(x);
  }
  // the residual sum's layer norm after the sublayer (post-norm), in place
  void norm_out(const LayerNorm& n, Tensor& x) {
    if (pre_norm_) return;
    Timer tm(timers(), kNorms);
    n.apply(x, x);
  }
  Tensor product(const Linear& lin, const Tensor& x, int64_t act, const Tensor* residual) {
    Timer tm(timers(), kProducts);
    return run_linear(lin, x, act, residual).contiguous();
  }

  Tensor layer(size_t i, Tensor x) {
    const Layer& l = layers_[i];
    Tensor qkv = product(l.qkv, norm_in(l.self_norm, x), kNone, nullptr);
    Tensor o;
    {
      Timer tm(timers(), kSelfAttention);
      o = self_attention(i, qkv);
    }
    x = product(l.out, o, kNone, &x);
    norm_out(l.self_norm, x);
    Tensor q = product(l.cross_q, norm_in(l.cross_norm, x), kNone, nullptr);
    {
      Timer tm(timers(), kCrossAttention);
      o = cross_attention(i, q);
    }
    x = product(l.cross_out, o, kNone, &x);
    norm_out(l.cross_norm, x);
    Tensor a = product(l.fc1, norm_in(l.ffn_norm, x), act_, nullptr);
    x = product(l.fc2, a, kNone, &x);
    norm_out(l.ffn_norm, x);
    return x;
  }

  // cache_[layer]: tcap x rcap x 2 x C (keys, then values, of each row of each step)
  void grow(int64_t need) {
    if (need <= tcap_) return;
    const int64_t cap = std::max<int64_t>(need, std::max<int64_t>(16, 2 * tcap_));
    for (auto& c : cache_) {
      Tensor grown = at::empty({cap, rcap_, 2, dim_}, embed_.options());
      if (c.defined() && steps_ > 0) grown.narrow(0, 0, steps_).copy_(c.narrow(0, 0, steps_));
      c = grown;
    }
    idx_.resize(static_cast<size_t>(cap * rcap_));
    tcap_ = cap;
  }

  Tensor self_attention(size_t layer, const Tensor& qkv) {
    const int64_t R = rows_, C = dim_, H = heads_, d = C / H, t = steps_;
    float* cache = cache_[layer].data_ptr<float>();
    const float* in = qkv.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {  // this step's keys and values, at [t][r]
      float* dst = cache + ((t * rcap_ + r) * 2) * C;
      std::memcpy(dst, in + r * 3 * C + C, sizeof(float) * 2 * C);
    }
    Tensor o = at::empty({R, C}, qkv.options());
    float* out = o.data_ptr<float>();
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    const int32_t* idx = idx_.data();
    const int64_t rcap = rcap_;
    at::parallel_for(0, R * H, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(t + 1);
      for (int64_t rh = begin; rh < end; ++rh) {
        const int64_t r = rh / H, h = rh % H;
        const float* q = in + r * 3 * C + h * d;
        auto key = [&](int64_t s) { return cache + ((s * rcap + idx[s * rcap + r]) * 2) * C + h * d; };
        int64_t s = 0;
#if defined(__AVX512F__)
        if (g_vector && d % 16 == 0) {
          const float* keys[16];
          for (; s + 16 <= t + 1; s += 16) {
            for (int i = 0; i < 16; ++i) keys[i] = key(s + i);
            dot16(q, keys, d, scores.data() + s);
            for (int i = 0; i < 16; ++i) scores[s + i] *= scale;
          }
        }
#endif
        for (; s + 4 <= t + 1; s += 4) {  // four keys a pass: independent sums keep the vector unit busy
          float d4[4];
          dot4(q, key(s), key(s + 1), key(s + 2), key(s + 3), d, d4);
          for (int i = 0; i < 4; ++i) scores[s + i] = d4[i] * scale;
        }
        for (; s <= t; ++s) scores[s] = dot(q, key(s), d) * scale;
        softmax_inplace(scores.data(), t + 1);
        attend_values(out + r * C + h * d, d, t + 1, scores.data(), [&](int64_t s) { return key(s) + C; });
      }
    });
    return o;
  }

  Tensor cross_attention(size_t layer, const Tensor& q) {
    const int64_t R = rows_, C = dim_, H = heads_, d = C / H, S = src_len_;
    const float* keys = memory_keys_[layer].data_ptr<float>();
    const float* values = memory_values_[layer].data_ptr<float>();
    const bool* valid = valid_.data_ptr<bool>();
    const float* qp = q.data_ptr<float>();
    Tensor o = at::empty({R, C}, q.options());
    float* out = o.data_ptr<float>();
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    at::parallel_for(0, R * H, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(S);
      float* sc = scores.data();
      for (int64_t rh = begin; rh < end; ++rh) {
        const int64_t r = rh / H, h = rh % H;
        const int64_t b = row_sent_[r];
        const float* qr = qp + r * C + h * d;
        const bool* vb = valid + b * S;
        const float* kt = keys + (b * H + h) * d * S;  // d x S
        const float* vs = values + (b * H + h) * S * d;  // S x d
        attend_keys_transposed(sc, S, qr, d, kt, scale);
        for (int64_t s = 0; s < S; ++s) {
          if (!vb[s]) sc[s] = neg_inf;
        }
        softmax_inplace(sc, S);  // (a masked position's weight is 0)
        attend_values(out + r * C + h * d, d, S, sc, [&](int64_t s) { return vs + s * d; });
      }
    });
    return o;
  }

  int64_t heads_;
  bool pre_norm_;
  int64_t act_;
  float embed_scale_;
  Tensor embed_, positions_;
  LayerNorm emb_norm_, final_norm_;
  bool has_final_norm_ = false;
  Linear output_;
  std::vector<Layer> layers_;
  int64_t dim_ = 0;

  // the batch
  int64_t sentences_ = 0, src_len_ = 0;
  Tensor valid_;
  std::vector<Tensor> memory_keys_;  // per layer: B x H x d x S
  std::vector<Tensor> memory_values_;  // per layer: B x H x S x d
  std::vector<int64_t> row_sent_;
  int64_t rows_ = 0, rcap_ = 0, steps_ = 0, tcap_ = 0;
  std::vector<Tensor> cache_;
  std::vector<int32_t> idx_;  // tcap x rcap

  bool profiling_ = false;
  std::array<double, kSections> prof_{};
};

// ------------------------------------------------------------------------------------------------ candidates
template <typename T>
struct Cand {
  T score;
  int64_t flat;  // row-in-sentence * V + token: the tie order (lower first)
};

template <typename T>
bool better(const Cand<T>& a, const Cand<T>& b) {
  return a.score > b.score || (a.score == b.score && a.flat < b.flat);
}

// The banned tokens of a row for --no-repeat-ngram-size n (NGramRepeatBlocker's rule): every token that followed
// an earlier occurrence of the row's last n-1 tokens; n = 1: every generated token.
void ngram_banned(const int64_t* h, int64_t t, int64_t n, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  if (n == 1) {
    for (int64_t i = 1; i < t; ++i) out.push_back(h[i]);
    return;
  }
  if (t < n) return;
  const int64_t* last = h + t - n + 1;
  for (int64_t i = 0; i + n - 1 < t; ++i) {
    if (std::equal(h + i, h + i + n - 1, last)) out.push_back(h[i + n - 1]);
  }
}

// The max of each block of v (bmax) and of all of v; `finite` false where some v is a NaN or an infinity
// (x * 0 is 0 for every finite x).
template <typename T>
T block_maxima_plain(const T* v, int64_t V, int64_t block, T* bmax, bool& finite) {
  T zero = 0, m = -std::numeric_limits<T>::infinity();
  for (int64_t lo = 0, b = 0; lo < V; lo += block, ++b) {
    const int64_t hi = std::min(V, lo + block);
    T bm = -std::numeric_limits<T>::infinity();
    for (int64_t j = lo; j < hi; ++j) {
      bm = v[j] > bm ? v[j] : bm;
      zero += v[j] * T(0);
    }
    bmax[b] = bm;
    m = std::max(m, bm);
  }
  finite = zero == T(0);
  return m;
}

// offer(j) for every j in [lo, hi) whose v[j] >= threshold (the others cannot enter the top k)
template <typename T, typename F>
void scan_block_plain(const T* v, int64_t lo, int64_t hi, T threshold, F&& offer) {
  for (int64_t j = lo; j < hi; ++j) {
    if (v[j] >= threshold) offer(j);
  }
}

#if defined(__AVX512F__)
inline float block_maxima_v(const float* v, int64_t V, int64_t block, float* bmax, bool& finite) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 nil = _mm512_setzero_ps();
  __m512 zero = nil, m = neg_inf;
  for (int64_t lo = 0, b = 0; lo < V; lo += block, ++b) {
    const int64_t hi = std::min(V, lo + block);
    __m512 bm = neg_inf;
    int64_t j = lo;
    for (; j + 16 <= hi; j += 16) {
      const __m512 x = _mm512_loadu_ps(v + j);
      bm = _mm512_max_ps(x, bm);
      zero = _mm512_add_ps(zero, _mm512_mul_ps(x, nil));
    }
    if (j < hi) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (hi - j)) - 1u);
      const __m512 x = _mm512_mask_loadu_ps(neg_inf, tail, v + j);
      bm = _mm512_max_ps(x, bm);
      zero = _mm512_add_ps(zero, _mm512_maskz_mul_ps(tail, x, nil));
    }
    bmax[b] = _mm512_reduce_max_ps(bm);
    m = _mm512_max_ps(bm, m);
  }
  finite = _mm512_reduce_add_ps(zero) == 0.f;
  return _mm512_reduce_max_ps(m);
}

template <typename F>
void scan_block_v(const float* v, int64_t lo, int64_t hi, float threshold, F&& offer) {
  const __m512 thr = _mm512_set1_ps(threshold);
  for (int64_t j = lo; j < hi; j += 16) {
    const __mmask16 in = j + 16 <= hi ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (hi - j)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(in, v + j);
    uint32_t hits = _mm512_mask_cmp_ps_mask(in, x, thr, _CMP_GE_OQ);
    while (hits) {
      offer(j + __builtin_ctz(hits));
      hits &= hits - 1;
    }
  }
}

#endif

template <typename T>
T block_maxima(const T* v, int64_t V, int64_t block, T* bmax, bool& finite) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (g_vector) return block_maxima_v(v, V, block, bmax, finite);
  }
#endif
  return block_maxima_plain(v, V, block, bmax, finite);
}

template <typename T, typename F>
void scan_block(const T* v, int64_t lo, int64_t hi, T threshold, F&& offer) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (g_vector) return scan_block_v(v, lo, hi, threshold, offer);
  }
#endif
  scan_block_plain(v, lo, hi, threshold, offer);
}

template <typename T>
void row_candidates(const T* x, int64_t V, T temperature, T prev, int64_t k, int64_t row_in_sent, int64_t pad,
                    int64_t unk, T unk_penalty, int64_t eos, bool ban_eos, bool only_eos,
                    const std::vector<int64_t>& banned, std::vector<T>& work, std::vector<Cand<T>>& out,
                    bool& finite) {
  // blocks of 128: their maxima let the top-k pass skip what cannot enter (one horizontal max per 128 values)
  constexpr int64_t kBlock = 128;
  const int64_t nblocks = (V + kBlock - 1) / kBlock;
  const bool scaled = temperature != T(1);
  work.resize(static_cast<size_t>((scaled ? V : 0) + nblocks));
  T* bmax = work.data();
  const T* v = x;
  if (scaled) {  // the logits divided by the temperature, as the eager step's logits / temperature
    T* w = work.data() + nblocks;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) w[j] = x[j] / temperature;
    v = w;
  }
  // pass 1: every block's max and the row's, and whether everything is finite
  const T m = block_maxima(v, V, kBlock, bmax, finite);
  if (!finite) return;  // a NaN or an infinity: the caller takes the generic path
  // pass 2: log of the sum of exp(v - max), over the whole vocabulary (masks apply after the softmax)
  T sum = 0;
  if constexpr (std::is_same_v<T, float>) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += fast_exp(v[j] - m);
  } else {
    for (int64_t j = 0; j < V; ++j) sum += std::exp(v[j] - m);
  }
  const T logsum = std::log(sum);
  auto score_of = [&](int64_t tok) {
    T lp = (v[tok] - m) - logsum;
    if (tok == unk) lp -= unk_penalty;
    return prev + lp;
  };
  out.clear();
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (only_eos) {  // at the sentence's max length only EOS may follow
    out.push_back({score_of(eos), row_in_sent * V + eos});
    return;
  }
  auto masked = [&](int64_t tok) {
    return tok == pad || tok == unk || (ban_eos && tok == eos) ||
           std::find(banned.begin(), banned.end(), tok) != banned.end();
  };
  // pass 3: the row's top k by v (the same order as by score), skipping blocks that cannot enter
  std::vector<std::pair<T, int64_t>> heap;  // min-heap on v of the best k so far
  heap.reserve(static_cast<size_t>(k + 1));
  auto worse = [](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  auto offer = [&](int64_t j) {
    if (static_cast<int64_t>(heap.size()) == k && v[j] < heap.front().first) return;
    if (masked(j)) return;
    heap.emplace_back(v[j], j);
    std::push_heap(heap.begin(), heap.end(), worse);
    if (static_cast<int64_t>(heap.size()) > k) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      heap.pop_back();
    }
  };
  for (int64_t b = 0; b < nblocks; ++b) {
    const bool full = static_cast<int64_t>(heap.size()) == k;
    if (full && !(bmax[b] >= heap.front().first)) continue;
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    scan_block(v, lo, hi, full ? heap.front().first : -std::numeric_limits<T>::infinity(), offer);
  }
  for (const auto& e : heap) out.push_back({score_of(e.second), row_in_sent * V + e.second});
  // unk: its penalty moves it against the others, so it competes by its own score
  if (unk >= 0 && unk < V && unk != pad && !(ban_eos && unk == eos) &&
      std::find(banned.begin(), banned.end(), unk) == banned.end()) {
    const T s = score_of(unk);
    if (s != neg_inf) out.push_back({s, row_in_sent * V + unk});
  }
  std::sort(out.begin(), out.end(), better<T>);
  if (static_cast<int64_t>(out.size()) > k) out.resize(static_cast<size_t>(k));
}

// The candidate step's core (beam_candidates, search): logits x (R x V, R = n * per), the rows' cumulative
// scores prev (none at step 0), at_max per sentence, each row's tokens so far (t of them, rows `stride` apart)
// for the n-gram rule. Writes scores, tokens and beams (n x k, best first, -inf / pad / 0 where a sentence has
// fewer than k candidates); false when a logit is not finite (NaN, +-inf).
template <typename T>
bool candidates_core(const T* x, int64_t R, int64_t V, const T* prev, int64_t k, double temperature, int64_t pad,
                     int64_t unk, double unk_penalty, int64_t eos, bool ban_eos, const bool* at_max, int64_t n,
                     const int64_t* hist, int64_t stride, int64_t t, int64_t ngram, T* scores, int64_t* tokens,
                     int64_t* beams) {
  TORCH_CHECK(n > 0 && R % n == 0, "beam_candidates: ", R, " rows for ", n, " sentences");
  const int64_t per = R / n;
  std::vector<std::vector<Cand<T>>> rows(static_cast<size_t>(R));
  std::vector<char> ok(static_cast<size_t>(R), 1);
  at::parallel_for(0, R, 4, [&](int64_t begin, int64_t end) {
    std::vector<T> work;
    std::vector<int64_t> banned;
    for (int64_t r = begin; r < end; ++r) {
      ngram_banned(hist + r * stride, t, ngram, banned);
      bool finite = true;
      row_candidates<T>(x + r * V, V, static_cast<T>(temperature), prev ? prev[r] : T(0), k, r % per, pad, unk,
                        static_cast<T>(unk_penalty), eos, ban_eos, at_max[r / per], banned, work, rows[r], finite);
      ok[r] = finite;
    }
  });
  for (char f : ok) {
    if (!f) return false;
  }
  std::vector<Cand<T>> merged;
  for (int64_t s = 0; s < n; ++s) {
    merged.clear();
    for (int64_t j = 0; j < per; ++j) {
      const auto& c = rows[s * per + j];
      merged.insert(merged.end(), c.begin(), c.end());
    }
    const int64_t take = std::min<int64_t>(k, static_cast<int64_t>(merged.size()));
    std::partial_sort(merged.begin(), merged.begin() + take, merged.end(), better<T>);
    for (int64_t i = 0; i < k; ++i) {
      scores[s * k + i] = i < take ? merged[i].score : -std::numeric_limits<T>::infinity();
      tokens[s * k + i] = i < take ? merged[i].flat % V : pad;
      beams[s * k + i] = i < take ? merged[i].flat / V : 0;
    }
  }
  return true;
}

template <typename T>
std::vector<Tensor> candidates_impl(const Tensor& logits, const Tensor& prev, int64_t k, double temperature,
                                    int64_t pad, int64_t unk, double unk_penalty, int64_t eos, bool ban_eos,
                                    const Tensor& at_max, const Tensor& history, int64_t ngram) {
  const int64_t R = logits.size(0), V = logits.size(1), n = at_max.size(0);
  Tensor scores = at::empty({n, k}, logits.options());
  Tensor tokens = at::empty({n, k}, logits.options().dtype(at::kLong));
  Tensor beams = at::empty({n, k}, logits.options().dtype(at::kLong));
  const bool ok = candidates_core<T>(
      logits.data_ptr<T>(), R, V, prev.defined() && prev.numel() ? prev.data_ptr<T>() : nullptr, k, temperature,
      pad, unk, unk_penalty, eos, ban_eos, at_max.data_ptr<bool>(), n, history.data_ptr<int64_t>(),
      history.size(1), history.size(1), ngram, scores.data_ptr<T>(), tokens.data_ptr<int64_t>(),
      beams.data_ptr<int64_t>());
  if (!ok) return {};
  return {scores, tokens, beams};
}

// The candidate step of beam search for n sentences (see the file's head). logits: R x V (R = n * rows per
// sentence: beam, or 1 at an unexpanded step 0), float32 or float64; prev: the rows' cumulative scores (empty at
// step 0); at_max: n bool, the sentences at their max length; history: R x t tokens (start token first) for the
// n-gram rule. Returns [scores, tokens, beams], each n x k, best first, or [] when a logit is not finite.
std::vector<Tensor> beam_candidates(const Tensor& logits, const Tensor& prev, int64_t k, double temperature,
                                    int64_t pad, int64_t unk, double unk_penalty, int64_t eos, bool ban_eos,
                                    const Tensor& at_max, const Tensor& history, int64_t ngram) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "beam_candidates: logits must be contiguous R x V");
  const Tensor am = at_max.to(at::kBool).contiguous();
  const Tensor hist = history.to(at::kLong).contiguous();
  const Tensor pv = prev.defined() && prev.numel() ? prev.to(logits.scalar_type()).contiguous() : Tensor();
  if (logits.scalar_type() == at::kDouble) {
    return candidates_impl<double>(logits, pv, k, temperature, pad, unk, unk_penalty, eos, ban_eos, am, hist, ngram);
  }
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "beam_candidates: logits must be float32 or float64");
  return candidates_impl<float>(logits, pv, k, temperature, pad, unk, unk_penalty, eos, ban_eos, am, hist, ngram);
}

// ------------------------------------------------------------------------------------------------ the loop
// One finished hypothesis: its final score (length-normalized unless told not to), its tokens (EOS last) and
// each token's log-probability.
struct Hyp {
  float score;
  std::vector<int64_t> tokens;
  std::vector<float> positional;
};

struct SearchSettings {
  int64_t beam, bos, eos, pad, unk, min_len, ngram;
  double len_penalty, unk_penalty, temperature;
  bool normalize;
};

// Beam search on a begun Decoder, the whole loop here: SequenceGenerator._eager's (fairseq's) rules step for
// step, with beam_candidates' candidate step (decode_step.py holds the rules; tests/unit/generation/
// test_cpu_step.py checks this loop against that one, hypothesis for hypothesis and bit for bit). `max_lens`:
// each sentence's most tokens before the final EOS. Returns every sentence's finished hypotheses in the order
// they finished (the caller sorts them as _collect does), or nothing when a logit was not finite (the caller
// then runs the batch through the Python loop, whose masks turn NaN into -inf).
std::vector<std::vector<Hyp>> search(Decoder& dec, const std::vector<int64_t>& max_lens, const SearchSettings& cfg,
                                     bool& ok) {
  const int64_t n0 = static_cast<int64_t>(max_lens.size()), beam = cfg.beam;
  const int64_t steps = *std::max_element(max_lens.begin(), max_lens.end());
  const int64_t cap = steps + 2;  // a row's tokens: the start token, steps + 1 chosen
  std::vector<std::vector<Hyp>> out(static_cast<size_t>(n0));
  ok = true;
  // per row (row = sentence slot * beam + hypothesis): tokens and cumulative scores, cap wide
  std::vector<int64_t> tok(static_cast<size_t>(n0 * beam * cap), cfg.pad), tok_next;
  std::vector<float> sc(static_cast<size_t>(n0 * beam * cap), 0.f), sc_next;
  for (int64_t r = 0; r < n0 * beam; ++r) tok[r * cap] = cfg.bos;
  std::vector<char> ignore(static_cast<size_t>(n0 * beam), 0);  // cands_to_ignore, sentence slot x beam
  std::vector<int64_t> active(n0), lens(max_lens), counts(n0, 0);
  for (int64_t j = 0; j < n0; ++j) active[j] = j;
  std::vector<float> cs;
  std::vector<int64_t> ct, cb, order, last;
  std::vector<char> eos_mask, at_max;
  std::vector<float> prev;
  const int64_t pad_pos = cfg.pad;
  for (int64_t step = 0; step <= steps; ++step) {
    const int64_t n = static_cast<int64_t>(active.size());
    const bool unexpanded = step == 0 && beam > 1;  // one decoder row per sentence until the first choice
    const int64_t per = step == 0 ? 1 : beam;
    const int64_t R = n * per;
    last.resize(R);
    for (int64_t r = 0; r < R; ++r) last[r] = tok[(r * (beam / per)) * cap + step];
    (void)unexpanded;
    const Tensor logits =
        dec.step(at::from_blob(last.data(), {R}, at::TensorOptions().dtype(at::kLong)), pad_pos + step + 1);
    const int64_t V = logits.size(1);
    const int64_t k = std::min<int64_t>(2 * beam, (step == 0 ? V : beam * V) - 1);
    at_max.resize(n);
    for (int64_t j = 0; j < n; ++j) at_max[j] = step >= lens[j];
    prev.resize(R);
    for (int64_t r = 0; r < R; ++r) prev[r] = step > 0 ? sc[r * cap + step - 1] : 0.f;
    cs.resize(n * k);
    ct.resize(n * k);
    cb.resize(n * k);
    if (!candidates_core<float>(logits.data_ptr<float>(), R, V, step > 0 ? prev.data() : nullptr, k,
                                cfg.temperature, cfg.pad, cfg.unk, cfg.unk_penalty, cfg.eos, step < cfg.min_len,
                                reinterpret_cast<const bool*>(at_max.data()), n, tok.data(), cap * (beam / per),
                                step + 1, cfg.ngram, cs.data(), ct.data(), cb.data())) {
      ok = false;
      return {};
    }
    // which candidates end here (EOS with a finite score, not in an ignored slot); the first `beam` finished
    // per sentence are kept
    eos_mask.assign(n * k, 0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < k; ++i) {
        char e = ct[j * k + i] == cfg.eos && cs[j * k + i] != -std::numeric_limits<float>::infinity();
        if (i < beam) e = e && !ignore[j * beam + i];
        eos_mask[j * k + i] = e;
      }
    }
    const float denom = static_cast<float>(std::pow(static_cast<double>(step + 1), cfg.len_penalty));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t b = 0; b < beam && b < k; ++b) {
        if (!eos_mask[j * k + b] || counts[active[j]] >= beam) continue;
        counts[active[j]] += 1;
        const int64_t row = j * beam + cb[j * k + b];
        const float eos_score = cs[j * k + b];
        Hyp h;
        h.tokens.assign(tok.begin() + row * cap + 1, tok.begin() + row * cap + 1 + step);
        h.tokens.push_back(cfg.eos);
        h.positional.resize(step + 1);
        float before = 0.f;
        for (int64_t i = 0; i <= step; ++i) {
          const float cum = i == step ? eos_score : sc[row * cap + i];
          h.positional[i] = i == 0 ? cum : cum - before;
          before = cum;
        }
        h.score = cfg.normalize ? eos_score / denom : eos_score;
        out[active[j]].push_back(std::move(h));
      }
    }
    std::vector<int64_t> keep;
    for (int64_t j = 0; j < n; ++j) {
      if (counts[active[j]] < beam && step < lens[j]) keep.push_back(j);
    }
    if (keep.empty()) break;
    // continue the first `beam` candidates of each kept sentence that did not end (continue_beams' rule: ended
    // or ignored candidates rank after the others, each group in candidate order)
    const int64_t m = static_cast<int64_t>(keep.size());
    tok_next.assign(static_cast<size_t>(m * beam * cap), cfg.pad);
    sc_next.assign(static_cast<size_t>(m * beam * cap), 0.f);
    std::vector<char> ignore_next(static_cast<size_t>(m * beam), 0);
    std::vector<int64_t> active_next(m), lens_next(m);
    order.resize(m * beam);
    for (int64_t jj = 0; jj < m; ++jj) {
      const int64_t j = keep[jj];
      active_next[jj] = active[j];
      lens_next[jj] = lens[j];
      for (int64_t i = 0; i < std::min(beam, k); ++i) {
        if (ignore[j * beam + i]) eos_mask[j * k + i] = 1;
      }
      int64_t slot = 0;
      for (int pass = 0; pass < 2 && slot < beam; ++pass) {
        for (int64_t i = 0; i < k && slot < beam; ++i) {
          if (eos_mask[j * k + i] != pass) continue;
          const int64_t src = j * beam + cb[j * k + i];
          const int64_t dst = jj * beam + slot;
          std::copy(tok.begin() + src * cap, tok.begin() + src * cap + step + 1, tok_next.begin() + dst * cap);
          tok_next[dst * cap + step + 1] = ct[j * k + i];
          std::copy(sc.begin() + src * cap, sc.begin() + src * cap + step, sc_next.begin() + dst * cap);
          sc_next[dst * cap + step] = cs[j * k + i];
          ignore_next[dst] = pass;
          order[dst] = step == 0 && beam > 1 ? src / beam : src;  // step 0's decoder rows are sentences
          ++slot;
        }
      }
      TORCH_CHECK(slot == beam, "search: fewer than beam candidates for a sentence");
    }
    std::swap(tok, tok_next);
    std::swap(sc, sc_next);
    ignore.swap(ignore_next);
    active.swap(active_next);
    lens.swap(lens_next);
    dec.reorder(at::from_blob(order.data(), {m * beam}, at::TensorOptions().dtype(at::kLong)));
  }
  return out;
}

py::object search_py(Decoder& dec, std::vector<int64_t> max_lens, int64_t beam, int64_t bos, int64_t eos,
                     int64_t pad, int64_t unk, int64_t min_len, double len_penalty, bool normalize,
                     double unk_penalty, double temperature, int64_t ngram) {
  const SearchSettings cfg{beam, bos, eos, pad, unk, min_len, ngram, len_penalty, unk_penalty, temperature, normalize};
  bool ok = true;
  std::vector<std::vector<Hyp>> found;
  {
    py::gil_scoped_release release;
    found = search(dec, max_lens, cfg, ok);
  }
  if (!ok) return py::none();
  py::list out;
  for (const auto& hyps : found) {
    py::list sentence;
    for (const Hyp& h : hyps) sentence.append(py::make_tuple(h.score, h.tokens, h.positional));
    out.append(sentence);
  }
  return out;
}

// A fingerprint of the tensors' contents (64-bit words summed, and summed weighted by their position): the
// packed weights are kept until it changes. A parameter's version counter is not enough: torch's fused AdamW
// updates parameters in place without counting, and ROUGE validation then decoded the first epoch's weights.
// One read of the weights a search (bart_base: ~560 MB, ~25 ms; a batch's search takes seconds).
int64_t fingerprint(const std::vector<Tensor>& tensors) {
  std::vector<uint64_t> parts(tensors.size() * 2, 0);
  at::parallel_for(0, static_cast<int64_t>(tensors.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Tensor t = tensors[i].contiguous();
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      const size_t n = t.nbytes(), words = n / 8;
      uint64_t sum = 0, weighted = 0;
#pragma omp simd reduction(+ : sum, weighted)
      for (size_t j = 0; j < words; ++j) {
        uint64_t w;
        std::memcpy(&w, bytes + 8 * j, 8);
        sum += w;
        weighted += w * (j + 1);
      }
      for (size_t j = 8 * words; j < n; ++j) sum += static_cast<uint64_t>(bytes[j]) << (8 * (j % 8));
      parts[2 * i] = sum;
      parts[2 * i + 1] = weighted ^ n;
    }
  });
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (uint64_t p : parts) h = (h ^ p) * 0x100000001B3ULL + (h >> 29);
  return static_cast<int64_t>(h);
}

Linear make_linear(int64_t kind, c10::optional<Tensor> weight, c10::optional<Tensor> bias, py::object packed,
                   int64_t out) {
  Linear l;
  l.kind = kind;
  if (weight.has_value()) l.weight = *weight;
  l.bias = bias;
  l.out = out;
  if (kind == kInt8) {
    static const auto type = torch::getCustomClass("__torch__.torch.classes.quantized.LinearPackedParamsBase");
    TORCH_CHECK(type, "torch has no quantized linear params class");
    l.packed = torch::jit::toIValue(packed, type);
  }
  return l;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "seqtrain's compiled CPU decoding step (seqtrain/generation/cpu_step.py)";
  py::class_<Linear>(m, "Linear").def(py::init(&make_linear), py::arg("kind"), py::arg("weight"), py::arg("bias"),
                                      py::arg("packed"), py::arg("out"));
  py::class_<Decoder>(m, "Decoder")
      .def(py::init<int64_t, bool, int64_t, double, Tensor, Tensor, Tensor, Tensor, double, c10::optional<Tensor>,
                    c10::optional<Tensor>, double, Linear>())
      .def("add_layer", &Decoder::add_layer)
      .def("begin", &Decoder::begin)
      .def("step", &Decoder::step, py::call_guard<py::gil_scoped_release>())
      .def("reorder", &Decoder::reorder)
      .def("set_profiling", &Decoder::set_profiling)
      .def("profile", &Decoder::profile)
      .def_property_readonly("rows", &Decoder::rows)
      .def_property_readonly("steps", &Decoder::steps);
  m.def("beam_candidates", &beam_candidates);
  m.def("search", &search_py);
  m.def("linear", [](const Linear& l, const Tensor& x, int64_t act, c10::optional<Tensor> residual) {
    return run_linear(l, x, act, residual.has_value() ? &*residual : nullptr);
  });
  m.def("bucket_rows", &bucket_rows);
  m.def("fingerprint", &fingerprint);
  m.def("set_vector_kernels", [](bool on) {
    const bool before = g_vector;
    g_vector = on;
    return before;
  });
  m.def("fast_exp", [](const Tensor& x) {
    Tensor c = x.to(at::kFloat).contiguous();
    Tensor y = at::empty_like(c);
    const float* a = c.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < c.numel(); ++i) b[i] = fast_exp(a[i]);
    return y;
  });
}
