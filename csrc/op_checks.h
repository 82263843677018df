// The argument checks, shape helpers and output allocation shared by the host wrappers of the ops
// (ops.cpp, ops_fp8.cpp): plain C++ against the LibTorch stable ABI, inline functions (external linkage,
// one definition across the translation units; hidden from the library's exports).
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"
#include "op_limits.h"

namespace qwen_fp4 {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    case ScalarType::Double: return "float64";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    default: return "another dtype";
  }
}

// "(v0, v1, ...)" of value(d) over t's dimensions.
template <class Value>
std::string dims_str(const Tensor& t, Value value) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(value(d));
  return s + ")";
}

inline std::string shape_str(const Tensor& t) {
  return dims_str(t, [&](int64_t d) { return t.size(d); });
}
inline std::string strides_str(const Tensor& t) {
  return dims_str(t, [&](int64_t d) { return t.stride(d); });
}

// On the same CUDA device as x.
inline void check_same_cuda_device(const char* name, const Tensor& t, const Tensor& x, const char* x_name = "x") {
  STD_TORCH_CHECK(t.is_cuda(), "qwen_fp4: ", name, " must be a CUDA tensor (", x_name,
                  " is on cuda:", x.get_device_index(), ")");
  STD_TORCH_CHECK(t.get_device_index() == x.get_device_index(), "qwen_fp4: ", name,
                  " is on cuda:", t.get_device_index(), " but ", x_name, " is on cuda:", x.get_device_index());
}

// Starts at a 16-byte boundary (the kernels use 16-byte vector accesses); `remedy` ends the message.
inline void check_aligned16(const char* name, const Tensor& t, const char* remedy = " pass a copy") {
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "qwen_fp4: ", name,
                  " must be 16-byte aligned (a view at an odd offset?", remedy, ")");
}

// On the same CUDA device as x, contiguous, 16-byte aligned (the kernels use 16-byte vector accesses).
inline void check_cuda_tensor(const char* name, const Tensor& t, const Tensor& x, bool vector_access = true,
                              const char* x_name = "x") {
  check_same_cuda_device(name, t, x, x_name);
  STD_TORCH_CHECK(t.is_contiguous(), "qwen_fp4: ", name, " must be contiguous");
  if (vector_access) check_aligned16(name, t);
}

inline void check_dtype(const char* name, const Tensor& t, bool allow_fp32) {
  const ScalarType d = t.scalar_type();
  const bool ok = d == ScalarType::BFloat16 || (allow_fp32 && d == ScalarType::Float);
  STD_TORCH_CHECK(ok, "qwen_fp4: ", name, " must be ", allow_fp32 ? "bfloat16 or float32" : "bfloat16", ", got ",
                  dtype_name(d));
}

// D of t ([..., D]): a positive multiple of `multiple` (kColsMultiple for the NVFP4 ops, kRowColsMultiple for
// the bf16 row op and the FP8 ops), at most kMaxCols.
inline int32_t check_cols(const char* name, const Tensor& t, int64_t multiple = kColsMultiple) {
  STD_TORCH_CHECK(t.dim() >= 1, "qwen_fp4: ", name, " must have at least one dimension ([..., D])");
  const int64_t cols = t.size(t.dim() - 1);
  STD_TORCH_CHECK(cols > 0 && cols % multiple == 0, "qwen_fp4: ", name,
                  ".shape[-1] (D) must be a positive multiple of ", multiple, ", got ", cols);
  STD_TORCH_CHECK(cols <= kMaxCols, "qwen_fp4: ", name, ".shape[-1] (D) must be at most ", kMaxCols, ", got ", cols);
  return static_cast<int32_t>(cols);
}

// Rows of t ([..., D], D = cols): at most kMaxRows.
inline int64_t check_rows(const char* name, const Tensor& t, int32_t cols) {
  const int64_t rows = t.numel() / cols;
  STD_TORCH_CHECK(rows <= kMaxRows, "qwen_fp4: ", name, " must have at most ", kMaxRows, " rows (", name,
                  ".numel() / D), got ", rows);
  return rows;
}

inline void check_global_scale(const Tensor& g, const Tensor& like, const char* like_name = "x") {
  check_cuda_tensor("global_scale", g, like, /*vector_access=*/false, like_name);
  STD_TORCH_CHECK(g.scalar_type() == ScalarType::Float, "qwen_fp4: global_scale must be float32, got ",
                  dtype_name(g.scalar_type()));
  STD_TORCH_CHECK(g.numel() == 1, "qwen_fp4: global_scale must have exactly one element, got shape ", shape_str(g));
}

// The recipe code (launch.h, kNvfp4Recipe*; qwen_resnorm_fp4/validation.py has the same rule): 0, or bit 0
// set with an error mode of 0 (MAE) or 1 (MSE) and no bit above bit 4.
inline int32_t check_nvfp4_4over6_code(int64_t code) {
  const bool known_bits = code >= 0 && (code >> kNvfp4RecipeKnownBits) == 0;
  const int64_t err_mode = (code >> kNvfp4RecipeErrModeShift) & kNvfp4RecipeErrModeMask;
  const bool valid = code == 0 || (known_bits && (code & kNvfp4Recipe4Over6) != 0 && err_mode <= 1);
  STD_TORCH_CHECK(valid,
                  "qwen_fp4: nvfp4_4over6_code must be 0 (the standard recipe) or FlashInfer's packing of "
                  "NVFP44Over6Config (bit 0 set; bit 1: e4m3_max 256; bits 2-3: err_mode 0 = MAE or 1 = MSE; "
                  "bit 4: err_use_fast_math; no other bits), got ",
                  code);
  return static_cast<int32_t>(code);
}

inline ParamRef column_param(const char* name, const std::optional<Tensor>& t, const Tensor& x, int32_t cols) {
  if (!t.has_value()) return {};
  check_cuda_tensor(name, *t, x);
  check_dtype(name, *t, /*allow_fp32=*/true);
  STD_TORCH_CHECK(t->dim() == 1 && t->size(0) == cols, "qwen_fp4: ", name, " must have shape (", cols, "), got ",
                  shape_str(*t));
  return {t->data_ptr(), t->scalar_type() == ScalarType::Float};
}

// The stride of dimension d in elements, 0 where the dimension has one entry (its stride never matters).
inline int64_t stride_or_zero(const Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

// A modulation parameter, [D], [B, D] or [B, S, D] (the shape rules: make_resnorm_args), read in place:
// last-dimension stride 1, each row at a 16-byte boundary. Strides: [B, D] and [B, 1, D] set batch_stride,
// [B, S, D] both; make_resnorm_args moves them where the form needs them.
inline ParamRef modulation_param(const char* name, const Tensor& t, const Tensor& x, int32_t cols) {
  check_same_cuda_device(name, t, x);
  check_dtype(name, t, /*allow_fp32=*/true);
  STD_TORCH_CHECK(t.dim() >= 1 && t.dim() <= 3 && t.size(t.dim() - 1) == cols, "qwen_fp4: ", name,
                  " must be [D], [B, D] or [B, S, D] with D=", cols, ", got shape ", shape_str(t));
  STD_TORCH_CHECK(t.stride(t.dim() - 1) == 1, "qwen_fp4: ", name,
                  " must have stride 1 in its last dimension, got strides ", strides_str(t), "; pass ", name,
                  ".contiguous()");
  check_aligned16(name, t);
  ParamRef p{t.data_ptr(), t.scalar_type() == ScalarType::Float};
  if (t.dim() >= 2) p.batch_stride = stride_or_zero(t, 0);
  if (t.dim() == 3) p.token_stride = stride_or_zero(t, 1);
  const int64_t elem_bytes = p.fp32 ? 4 : 2;
  STD_TORCH_CHECK((p.batch_stride * elem_bytes) % 16 == 0 && (p.token_stride * elem_bytes) % 16 == 0,
                  "qwen_fp4: ", name, "'s rows must start at 16-byte boundaries: its strides ", strides_str(t),
                  " (elements of ", elem_bytes, " bytes) are not multiples of 16 bytes; pass ", name, ".contiguous()");
  return p;
}

// Per token with one row per x row: token m (no batch index), each tensor's row stride token_stride.
inline void make_flat_per_token(ParamRef& p, bool from_batch_dim) {
  if (from_batch_dim) p.token_stride = p.batch_stride;
  p.batch_stride = 0;
}

inline void* current_stream(const Tensor& x) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "qwen_fp4: could not get the current CUDA stream");
  return stream;
}

// x's device and its current stream.
inline LaunchTarget launch_target(const Tensor& x) { return {x.get_device_index(), current_stream(x)}; }

// Everything the row ops share (bf16, NVFP4, FP8 output; with and without the residual update): checks, and the
// kernel arguments except the outputs.
inline ResnormArgs make_resnorm_args(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                     const Tensor& gate, const Tensor& scale, const Tensor& shift, double eps,
                                     const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                     const std::optional<Tensor>& modulate_index,
                                     int64_t cols_multiple = kColsMultiple) {
  STD_TORCH_CHECK(x.is_cuda(), "qwen_fp4: x must be a CUDA tensor for the CUDA kernels");
  check_cuda_tensor("x", x, x);
  check_cuda_tensor("residual", residual, x);
  check_dtype("x", x, false);
  check_dtype("residual", residual, false);
  const int32_t cols = check_cols("x", x, cols_multiple);
  STD_TORCH_CHECK(residual.dim() == x.dim(), "qwen_fp4: residual shape ", shape_str(residual), " must equal x shape ",
                  shape_str(x));
  for (int64_t d = 0; d < x.dim(); ++d) {
    STD_TORCH_CHECK(residual.size(d) == x.size(d), "qwen_fp4: residual shape ", shape_str(residual),
                    " must equal x shape ", shape_str(x));
  }
  STD_TORCH_CHECK(std::isfinite(eps) && eps >= 0, "qwen_fp4: eps must be finite and >= 0, got ", eps);

  ResnormArgs a{};
  a.residual = residual.data_ptr();
  a.x = x.data_ptr();
  a.cols = cols;
  a.rows = check_rows("x", x, cols);
  a.eps = static_cast<float>(eps);
  a.inv_cols = 1.0f / static_cast<float>(cols);  // correctly rounded, as the reference's 1 / D in fp32
  a.bias = column_param("bias", bias, x, cols);
  a.weight = column_param("weight", weight, x, cols);
  a.norm_bias = column_param("norm_bias", norm_bias, x, cols);
  a.gate = modulation_param("gate", gate, x, cols);
  a.scale = modulation_param("scale", scale, x, cols);
  a.shift = modulation_param("shift", shift, x, cols);
  bool one_shape = gate.dim() == scale.dim() && gate.dim() == shift.dim();
  for (int64_t d = 0; one_shape && d < gate.dim(); ++d) {
    one_shape = gate.size(d) == scale.size(d) && gate.size(d) == shift.size(d);
  }
  STD_TORCH_CHECK(one_shape, "qwen_fp4: gate, scale and shift must have one shape, got ", shape_str(gate), ", ",
                  shape_str(scale), ", ", shape_str(shift));
  ParamRef* const modulation[3] = {&a.gate, &a.scale, &a.shift};

  if (modulate_index.has_value()) {
    const Tensor& idx = *modulate_index;
    check_cuda_tensor("modulate_index", idx, x, /*vector_access=*/false);
    const ScalarType it = idx.scalar_type();
    STD_TORCH_CHECK(it == ScalarType::Int || it == ScalarType::Long || it == ScalarType::Bool,
                    "qwen_fp4: modulate_index must be int32, int64 or bool, got ", dtype_name(it));
    STD_TORCH_CHECK(idx.dim() == 2, "qwen_fp4: modulate_index must be [B, S], got shape ", shape_str(idx));
    const int64_t b = idx.size(0), s = idx.size(1);
    STD_TORCH_CHECK(gate.dim() == 2 && gate.size(0) == 2 * b, "qwen_fp4: with modulate_index of shape ", shape_str(idx),
                    ", gate/scale/shift must be [2B, D] = [", 2 * b, ", ", cols, "], got ", shape_str(gate));
    STD_TORCH_CHECK(b * s == a.rows, "qwen_fp4: modulate_index has ", b * s, " entries but x has ", a.rows, " rows");
    a.form = ModulationForm::kIndexed;
    a.modulate_index = idx.data_ptr();
    a.index_dtype = it == ScalarType::Int    ? IndexDtype::kInt32
                    : it == ScalarType::Long ? IndexDtype::kInt64
                                             : IndexDtype::kBool;
    a.num_batches = static_cast<int32_t>(b);
    a.rows_per_batch = s;
  } else if (gate.dim() == 3 && gate.size(1) != 1) {
    const int64_t b = gate.size(0), s = gate.size(1);
    STD_TORCH_CHECK(b * s == a.rows, "qwen_fp4: per-token gate/scale/shift [B, S, D] need B * S = x's rows (", a.rows,
                    "), got shape ", shape_str(gate));
    a.form = ModulationForm::kPerToken;
    a.num_batches = static_cast<int32_t>(b);
    a.rows_per_batch = s;
    // The two leading dimensions addressed as one row index in all three: token m, no division.
    bool flat = true;
    for (const ParamRef* p : modulation) flat = flat && (b == 1 || p->batch_stride == s * p->token_stride);
    if (flat) {
      a.rows_per_batch = a.rows;
      for (ParamRef* p : modulation) make_flat_per_token(*p, /*from_batch_dim=*/false);
    }
  } else if (gate.dim() >= 2) {  // [B, D] or [B, 1, D]
    const int64_t b = gate.size(0);
    STD_TORCH_CHECK(b > 0 && a.rows % b == 0, "qwen_fp4: x has ", a.rows,
                    " rows, which do not split into gate.shape[0] = ", b, " batches");
    a.num_batches = static_cast<int32_t>(b);
    a.rows_per_batch = a.rows / b;
    a.form = ModulationForm::kPerBatch;
    if (b == a.rows && b > 1) {  // one row per token: per token, no division
      a.form = ModulationForm::kPerToken;
      a.rows_per_batch = a.rows;
      for (ParamRef* p : modulation) make_flat_per_token(*p, /*from_batch_dim=*/true);
    }
  } else {
    a.form = ModulationForm::kShared;
    a.num_batches = 1;
    a.rows_per_batch = a.rows;
  }
  return a;
}

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> s(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) s[d] = t.size(d);
  return s;
}

// Contiguous CUDA tensor on like's device. aoti_torch_empty_strided goes straight to the allocator,
// much cheaper per call than a boxed aten::new_empty through the dispatcher.
inline Tensor empty_cuda(const Tensor& like, const std::vector<int64_t>& sizes, int32_t dtype) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= sizes[d] > 0 ? sizes[d] : 1;
  }
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(
      aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dtype,
                               aoti_torch_device_type_cuda(), like.get_device_index(), &handle) == AOTI_TORCH_SUCCESS,
      "qwen_fp4: allocating an output failed");
  return Tensor(handle);
}

inline Tensor new_bytes(const Tensor& like, int64_t rows, int64_t cols) {
  return empty_cuda(like, {rows, cols}, aoti_torch_dtype_uint8());
}

inline Tensor empty_like_bf16(const Tensor& x) { return empty_cuda(x, sizes_of(x), aoti_torch_dtype_bfloat16()); }

// The quantizing ops' outputs wired into the kernel arguments (ResnormArgs or QuantizeArgs): packed codes
// [rows, cols / 2] and the 128x4 scales [scale_rows(rows), cols / 16] (the kernels write the padding rows too).
template <class Args>
void set_quantized_outputs(Args& a, const Tensor& packed, const Tensor& scales, const Tensor& global_scale) {
  a.packed = static_cast<uint8_t*>(packed.data_ptr());
  a.scales = static_cast<uint8_t*>(scales.data_ptr());
  a.global_scale = static_cast<const float*>(global_scale.data_ptr());
}

// The functional quantizing ops' outputs, allocated: (packed, scales) for rows of cols.
inline std::pair<Tensor, Tensor> new_quantized_outputs(const Tensor& like, int64_t rows, int32_t cols) {
  return {new_bytes(like, rows, cols / 2), new_bytes(like, scale_rows(rows), cols / 16)};
}

// ---- The out-variants' outputs (the rules of validation.py's out-variant section) ----

// A caller-provided output: on like's CUDA device, of one of `dtypes`, of exactly `sizes`, contiguous,
// 16-byte aligned (the kernels store 16-byte vectors).
inline void check_output(const char* name, const Tensor& t, const Tensor& like, const char* like_name,
                         std::initializer_list<ScalarType> dtypes, const std::vector<int64_t>& sizes) {
  check_same_cuda_device(name, t, like, like_name);
  bool dtype_ok = false;
  std::string allowed;
  for (ScalarType d : dtypes) {
    dtype_ok = dtype_ok || t.scalar_type() == d;
    allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  STD_TORCH_CHECK(dtype_ok, "qwen_fp4: ", name, " must be ", allowed, ", got ", dtype_name(t.scalar_type()));
  bool shape_ok = t.dim() == static_cast<int64_t>(sizes.size());
  for (int64_t d = 0; shape_ok && d < t.dim(); ++d) shape_ok = t.size(d) == sizes[d];
  std::string want = "(";
  for (size_t d = 0; d < sizes.size(); ++d) want += (d ? ", " : "") + std::to_string(sizes[d]);
  STD_TORCH_CHECK(shape_ok, "qwen_fp4: ", name, " must have shape ", want + ")", ", got ", shape_str(t));
  STD_TORCH_CHECK(t.is_contiguous(), "qwen_fp4: ", name, " must be contiguous (the kernels write it row by row)");
  check_aligned16(name, t, /*remedy=*/"");
}

// packed and scales of an out-variant for rows of like ([..., cols]).
inline void check_quantized_outputs(const Tensor& packed, const Tensor& scales, const Tensor& like,
                                    const char* like_name, int64_t rows, int32_t cols) {
  check_output("packed", packed, like, like_name, {ScalarType::Byte}, {rows, cols / 2});
  check_output("scales", scales, like, like_name, {ScalarType::Byte, ScalarType::Float8_e4m3fn},
               {scale_rows(rows), cols / 16});
}

// The bytes [begin, end) t's elements lie in (a strided view's gaps included); begin == end when empty.
struct ByteSpan {
  uintptr_t begin, end;
  bool overlaps(const ByteSpan& o) const { return begin < o.end && o.begin < end; }
};

inline ByteSpan byte_span(const Tensor& t) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (t.numel() == 0) return {begin, begin};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {begin, begin + static_cast<uintptr_t>(last + 1) * t.element_size()};
}

// The same memory, shape, strides and dtype: residual_out given as residual itself.
inline bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data_ptr() != b.data_ptr() || a.dim() != b.dim() || a.scalar_type() != b.scalar_type()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d) || a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// An argument by name; t == nullptr: an absent optional input. (Hidden like torch::stable::Tensor, which
// it points to: the library exports neither.)
struct __attribute__((visibility("hidden"))) NamedTensor {
  const char* name;
  const Tensor* t;
};

inline const Tensor* optional_ptr(const std::optional<Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// No output overlaps another output or an input, except that output `in_place_output` may be input
// `in_place_input` itself (same_view): the in-place residual update, safe because each kernel's thread
// reads its residual vectors before it stores them and no other CTA reads them (split_rows excludes it).
inline void check_no_overlap(std::initializer_list<NamedTensor> outputs, std::initializer_list<NamedTensor> inputs,
                             const char* in_place_output = nullptr, const char* in_place_input = nullptr) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    const ByteSpan span = byte_span(*out->t);
    for (auto other = outputs.begin(); other != out; ++other) {
      STD_TORCH_CHECK(!span.overlaps(byte_span(*other->t)), "qwen_fp4: ", out->name, " overlaps ", other->name,
                      " in memory: the outputs must be distinct");
    }
    for (const NamedTensor& in : inputs) {
      if (in.t == nullptr || !span.overlaps(byte_span(*in.t))) continue;
      const bool in_place_pair = in_place_output != nullptr && std::string(out->name) == in_place_output &&
                                 std::string(in.name) == in_place_input;
      if (in_place_pair && same_view(*out->t, *in.t)) continue;
      STD_TORCH_CHECK(false, "qwen_fp4: ", out->name, " overlaps the input ", in.name, " in memory",
                      in_place_pair ? std::string(" (") + out->name + " may be " + in.name + " itself, not part of it)"
                                    : std::string());
    }
  }
}

}  // namespace qwen_fp4
