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

#include <algorithm>
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

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
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

// act(x W^T + b) (+ residual): 2-D x (rows x in) -> rows x out. oneDNN applies the activation or the residual
// add as a post-op of the product; the other backends as a pass after it (the same values as the eager step's
// separate ops: x + f(x) and f(x) + x are one float addition).
Tensor run_linear(const Linear& lin, const Tensor& x, int64_t act, const Tensor* residual) {
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
    memory_kv_.clear();
    for (const Layer& l : layers_) memory_kv_.push_back(run_linear(l.cross_kv, flat, kNone, nullptr).contiguous());
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

    Tensor x = embed(tokens.to(at::kLong).contiguous(), position);
    for (size_t i = 0; i < layers_.size(); ++i) x = layer(i, x);
    if (has_final_norm_) final_norm_.apply(x, x);
    steps_ += 1;
    return run_linear(output_, x, kNone, nullptr);
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

  Tensor layer(size_t i, Tensor x) {
    const Layer& l = layers_[i];
    // self-attention
    Tensor h = pre_norm_ ? l.self_norm(x) : x;
    Tensor qkv = run_linear(l.qkv, h, kNone, nullptr).contiguous();
    Tensor o = self_attention(i, qkv);
    x = run_linear(l.out, o, kNone, &x);
    if (!pre_norm_) l.self_norm.apply(x, x);
    // cross-attention
    h = pre_norm_ ? l.cross_norm(x) : x;
    Tensor q = run_linear(l.cross_q, h, kNone, nullptr).contiguous();
    o = cross_attention(i, q);
    x = run_linear(l.cross_out, o, kNone, &x);
    if (!pre_norm_) l.cross_norm.apply(x, x);
    // feed-forward
    h = pre_norm_ ? l.ffn_norm(x) : x;
    Tensor a = run_linear(l.fc1, h, act_, nullptr);
    x = run_linear(l.fc2, a, kNone, &x);
    if (!pre_norm_) l.ffn_norm.apply(x, x);
    return x.contiguous();
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
        for (int64_t s = 0; s <= t; ++s) {
          const int64_t row = idx[s * rcap + r];
          scores[s] = dot(q, cache + ((s * rcap + row) * 2) * C + h * d, d) * scale;
        }
        softmax_inplace(scores.data(), t + 1);
        float* y = out + r * C + h * d;
        std::fill(y, y + d, 0.f);
        for (int64_t s = 0; s <= t; ++s) {
          const float p = scores[s];
          const float* v = cache + ((s * rcap + idx[s * rcap + r]) * 2 + 1) * C + h * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) y[j] += p * v[j];
        }
      }
    });
    return o;
  }

  Tensor cross_attention(size_t layer, const Tensor& q) {
    const int64_t R = rows_, C = dim_, H = heads_, d = C / H, S = src_len_;
    const float* kv = memory_kv_[layer].data_ptr<float>();
    const bool* valid = valid_.data_ptr<bool>();
    const float* qp = q.data_ptr<float>();
    Tensor o = at::empty({R, C}, q.options());
    float* out = o.data_ptr<float>();
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    at::parallel_for(0, R * H, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(S);
      for (int64_t rh = begin; rh < end; ++rh) {
        const int64_t r = rh / H, h = rh % H;
        const int64_t b = row_sent_[r];
        const float* qr = qp + r * C + h * d;
        const bool* vb = valid + b * S;
        const float* base = kv + (b * S) * 2 * C + h * d;
        for (int64_t s = 0; s < S; ++s) scores[s] = vb[s] ? dot(qr, base + s * 2 * C, d) * scale : neg_inf;
        softmax_inplace(scores.data(), S);
        float* y = out + r * C + h * d;
        std::fill(y, y + d, 0.f);
        for (int64_t s = 0; s < S; ++s) {
          if (!vb[s]) continue;
          const float p = scores[s];
          const float* v = base + s * 2 * C + C;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) y[j] += p * v[j];
        }
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
  std::vector<Tensor> memory_kv_;  // per layer: (B*S) x 2C, keys then values
  std::vector<int64_t> row_sent_;
  int64_t rows_ = 0, rcap_ = 0, steps_ = 0, tcap_ = 0;
  std::vector<Tensor> cache_;
  std::vector<int32_t> idx_;  // tcap x rcap
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

template <typename T>
void row_candidates(const T* x, int64_t V, T temperature, T prev, int64_t k, int64_t row_in_sent, int64_t pad,
                    int64_t unk, T unk_penalty, int64_t eos, bool ban_eos, bool only_eos,
                    const std::vector<int64_t>& banned, std::vector<T>& work, std::vector<Cand<T>>& out,
                    bool& finite) {
  constexpr int64_t kBlock = 16;
  const int64_t nblocks = (V + kBlock - 1) / kBlock;
  work.resize(static_cast<size_t>(V + nblocks));
  T* v = work.data();
  T* bmax = v + V;
  // pass 1: the temperature, the row's max, every block's max, and whether everything is finite
  T zero = 0;
  if (temperature != T(1)) {
#pragma omp simd reduction(+ : zero)
    for (int64_t j = 0; j < V; ++j) {
      v[j] = x[j] / temperature;
      zero += v[j] * T(0);
    }
  } else {
#pragma omp simd reduction(+ : zero)
    for (int64_t j = 0; j < V; ++j) {
      v[j] = x[j];
      zero += x[j] * T(0);
    }
  }
  if (!(zero == T(0))) {  // a NaN or an infinity: the caller takes the generic path
    finite = false;
    return;
  }
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    T bm = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : bm)
    for (int64_t j = lo; j < hi; ++j) bm = std::max(bm, v[j]);
    bmax[b] = bm;
    m = std::max(m, bm);
  }
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
  for (int64_t b = 0; b < nblocks; ++b) {
    if (static_cast<int64_t>(heap.size()) == k && !(bmax[b] >= heap.front().first)) continue;
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    for (int64_t j = lo; j < hi; ++j) {
      if (static_cast<int64_t>(heap.size()) == k && v[j] < heap.front().first) continue;
      if (masked(j)) continue;
      heap.emplace_back(v[j], j);
      std::push_heap(heap.begin(), heap.end(), worse);
      if (static_cast<int64_t>(heap.size()) > k) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        heap.pop_back();
      }
    }
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

template <typename T>
std::vector<Tensor> candidates_impl(const Tensor& logits, const Tensor& prev, int64_t k, double temperature,
                                    int64_t pad, int64_t unk, double unk_penalty, int64_t eos, bool ban_eos,
                                    const Tensor& at_max, const Tensor& history, int64_t ngram) {
  const int64_t R = logits.size(0), V = logits.size(1), n = at_max.size(0);
  TORCH_CHECK(n > 0 && R % n == 0, "beam_candidates: ", R, " rows for ", n, " sentences");
  const int64_t per = R / n;
  const T* x = logits.data_ptr<T>();
  const T* p = prev.defined() && prev.numel() ? prev.data_ptr<T>() : nullptr;
  const bool* am = at_max.data_ptr<bool>();
  const int64_t* hist = history.data_ptr<int64_t>();
  const int64_t t = history.size(1);
  std::vector<std::vector<Cand<T>>> rows(static_cast<size_t>(R));
  std::vector<char> ok(static_cast<size_t>(R), 1);
  at::parallel_for(0, R, 4, [&](int64_t begin, int64_t end) {
    std::vector<T> work;
    std::vector<int64_t> banned;
    for (int64_t r = begin; r < end; ++r) {
      ngram_banned(hist + r * t, t, ngram, banned);
      bool finite = true;
      row_candidates<T>(x + r * V, V, static_cast<T>(temperature), p ? p[r] : T(0), k, r % per, pad, unk,
                        static_cast<T>(unk_penalty), eos, ban_eos, am[r / per], banned, work, rows[r], finite);
      ok[r] = finite;
    }
  });
  for (char f : ok) {
    if (!f) return {};
  }
  Tensor scores = at::full({n, k}, -std::numeric_limits<T>::infinity(), logits.options());
  Tensor tokens = at::full({n, k}, pad, logits.options().dtype(at::kLong));
  Tensor beams = at::zeros({n, k}, logits.options().dtype(at::kLong));
  T* sp = scores.data_ptr<T>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  int64_t* bp = beams.data_ptr<int64_t>();
  std::vector<Cand<T>> merged;
  for (int64_t s = 0; s < n; ++s) {
    merged.clear();
    for (int64_t j = 0; j < per; ++j) {
      const auto& c = rows[s * per + j];
      merged.insert(merged.end(), c.begin(), c.end());
    }
    const int64_t take = std::min<int64_t>(k, static_cast<int64_t>(merged.size()));
    std::partial_sort(merged.begin(), merged.begin() + take, merged.end(), better<T>);
    for (int64_t i = 0; i < take; ++i) {
      sp[s * k + i] = merged[i].score;
      tp[s * k + i] = merged[i].flat % V;
      bp[s * k + i] = merged[i].flat / V;
    }
  }
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
      .def_property_readonly("rows", &Decoder::rows)
      .def_property_readonly("steps", &Decoder::steps);
  m.def("beam_candidates", &beam_candidates);
  m.def("linear", [](const Linear& l, const Tensor& x, int64_t act, c10::optional<Tensor> residual) {
    return run_linear(l, x, act, residual.has_value() ? &*residual : nullptr);
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
