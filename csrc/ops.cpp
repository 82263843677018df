// Host wrappers of the qwen_fp4 ops for CUDA tensors, against the LibTorch stable ABI: argument checks
// (they hold on their own, whatever the Python layer did), output allocation through torch (so CUDA-graph
// capture works), launch on the current stream of the tensors' device under a device guard, no host sync.
#include "ops.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"
#include "op_limits.h"

namespace qwen_fp4 {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

namespace {

const char* dtype_name(ScalarType t) {
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

std::string shape_str(const Tensor& t) { return dims_str(t, [&](int64_t d) { return t.size(d); }); }
std::string strides_str(const Tensor& t) { return dims_str(t, [&](int64_t d) { return t.stride(d); }); }

// On the same CUDA device as x.
void check_same_cuda_device(const char* name, const Tensor& t, const Tensor& x, const char* x_name = "x") {
  STD_TORCH_CHECK(t.is_cuda(), "qwen_fp4: ", name, " must be a CUDA tensor (", x_name, " is on cuda:",
                  x.get_device_index(), ")");
  STD_TORCH_CHECK(t.get_device_index() == x.get_device_index(), "qwen_fp4: ", name, " is on cuda:",
                  t.get_device_index(), " but ", x_name, " is on cuda:", x.get_device_index());
}

// Starts at a 16-byte boundary (the kernels use 16-byte vector accesses); `remedy` ends the message.
void check_aligned16(const char* name, const Tensor& t, const char* remedy = " pass a copy") {
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "qwen_fp4: ", name,
                  " must be 16-byte aligned (a view at an odd offset?", remedy, ")");
}

// On the same CUDA device as x, contiguous, 16-byte aligned (the kernels use 16-byte vector accesses).
void check_cuda_tensor(const char* name, const Tensor& t, const Tensor& x, bool vector_access = true,
                       const char* x_name = "x") {
  check_same_cuda_device(name, t, x, x_name);
  STD_TORCH_CHECK(t.is_contiguous(), "qwen_fp4: ", name, " must be contiguous");
  if (vector_access) check_aligned16(name, t);
}

void check_dtype(const char* name, const Tensor& t, bool allow_fp32) {
  const ScalarType d = t.scalar_type();
  const bool ok = d == ScalarType::BFloat16 || (allow_fp32 && d == ScalarType::Float);
  STD_TORCH_CHECK(ok, "qwen_fp4: ", name, " must be ", allow_fp32 ? "bfloat16 or float32" : "bfloat16", ", got ",
                  dtype_name(d));
}

int32_t check_cols(const char* name, const Tensor& t) {
  STD_TORCH_CHECK(t.dim() >= 1, "qwen_fp4: ", name, " must have at least one dimension ([..., D])");
  const int64_t cols = t.size(t.dim() - 1);
  STD_TORCH_CHECK(cols > 0 && cols % kColsMultiple == 0, "qwen_fp4: ", name,
                  ".shape[-1] (D) must be a positive multiple of ", kColsMultiple, ", got ", cols);
  STD_TORCH_CHECK(cols <= kMaxCols, "qwen_fp4: ", name, ".shape[-1] (D) must be at most ", kMaxCols, ", got ", cols);
  return static_cast<int32_t>(cols);
}

// Rows of t ([..., D], D = cols): at most kMaxRows.
int64_t check_rows(const char* name, const Tensor& t, int32_t cols) {
  const int64_t rows = t.numel() / cols;
  STD_TORCH_CHECK(rows <= kMaxRows, "qwen_fp4: ", name, " must have at most ", kMaxRows, " rows (", name,
                  ".numel() / D), got ", rows);
  return rows;
}

void check_global_scale(const Tensor& g, const Tensor& like, const char* like_name = "x") {
  check_cuda_tensor("global_scale", g, like, /*vector_access=*/false, like_name);
  STD_TORCH_CHECK(g.scalar_type() == ScalarType::Float, "qwen_fp4: global_scale must be float32, got ",
                  dtype_name(g.scalar_type()));
  STD_TORCH_CHECK(g.numel() == 1, "qwen_fp4: global_scale must have exactly one element, got shape ", shape_str(g));
}

// The recipe code (launch.h, kNvfp4Recipe*; qwen_resnorm_fp4/validation.py has the same rule): 0, or bit 0
// set with an error mode of 0 (MAE) or 1 (MSE) and no bit above bit 4.
int32_t check_nvfp4_4over6_code(int64_t code) {
  const bool known_bits = code >= 0 && (code >> kNvfp4RecipeKnownBits) == 0;
  const int64_t err_mode = (code >> kNvfp4RecipeErrModeShift) & kNvfp4RecipeErrModeMask;
  const bool valid = code == 0 || (known_bits && (code & kNvfp4Recipe4Over6) != 0 && err_mode <= 1);
  STD_TORCH_CHECK(valid, "qwen_fp4: nvfp4_4over6_code must be 0 (the standard recipe) or FlashInfer's packing of "
                  "NVFP44Over6Config (bit 0 set; bit 1: e4m3_max 256; bits 2-3: err_mode 0 = MAE or 1 = MSE; "
                  "bit 4: err_use_fast_math; no other bits), got ", code);
  return static_cast<int32_t>(code);
}

ParamRef column_param(const char* name, const std::optional<Tensor>& t, const Tensor& x, int32_t cols) {
  if (!t.has_value()) return {};
  check_cuda_tensor(name, *t, x);
  check_dtype(name, *t, /*allow_fp32=*/true);
  STD_TORCH_CHECK(t->dim() == 1 && t->size(0) == cols, "qwen_fp4: ", name, " must have shape (", cols, "), got ",
                  shape_str(*t));
  return {t->data_ptr(), t->scalar_type() == ScalarType::Float};
}

// The stride of dimension d in elements, 0 where the dimension has one entry (its stride never matters).
int64_t stride_or_zero(const Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

// A modulation parameter, [D], [B, D] or [B, S, D] (the shape rules: make_resnorm_args), read in place:
// last-dimension stride 1, each row at a 16-byte boundary. Strides: [B, D] and [B, 1, D] set batch_stride,
// [B, S, D] both; make_resnorm_args moves them where the form needs them.
ParamRef modulation_param(const char* name, const Tensor& t, const Tensor& x, int32_t cols) {
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
  STD_TORCH_CHECK((p.batch_stride * elem_bytes) % 16 == 0 && (p.token_stride * elem_bytes) % 16 == 0, "qwen_fp4: ",
                  name, "'s rows must start at 16-byte boundaries: its strides ", strides_str(t), " (elements of ",
                  elem_bytes, " bytes) are not multiples of 16 bytes; pass ", name, ".contiguous()");
  return p;
}

// Per token with one row per x row: token m (no batch index), each tensor's row stride token_stride.
void make_flat_per_token(ParamRef& p, bool from_batch_dim) {
  if (from_batch_dim) p.token_stride = p.batch_stride;
  p.batch_stride = 0;
}

void* current_stream(const Tensor& x) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "qwen_fp4: could not get the current CUDA stream");
  return stream;
}

// x's device and its current stream.
LaunchTarget launch_target(const Tensor& x) { return {x.get_device_index(), current_stream(x)}; }

// Everything resnorm and resnorm_quant share: checks, and the kernel arguments except the outputs.
ResnormArgs make_resnorm_args(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                              const Tensor& gate, const Tensor& scale, const Tensor& shift, double eps,
                              const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                              const std::optional<Tensor>& modulate_index) {
  STD_TORCH_CHECK(x.is_cuda(), "qwen_fp4: x must be a CUDA tensor for the CUDA kernels");
  check_cuda_tensor("x", x, x);
  check_cuda_tensor("residual", residual, x);
  check_dtype("x", x, false);
  check_dtype("residual", residual, false);
  const int32_t cols = check_cols("x", x);
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
    STD_TORCH_CHECK(gate.dim() == 2 && gate.size(0) == 2 * b, "qwen_fp4: with modulate_index of shape ",
                    shape_str(idx), ", gate/scale/shift must be [2B, D] = [", 2 * b, ", ", cols, "], got ",
                    shape_str(gate));
    STD_TORCH_CHECK(b * s == a.rows, "qwen_fp4: modulate_index has ", b * s, " entries but x has ", a.rows, " rows");
    a.form = ModulationForm::kIndexed;
    a.modulate_index = idx.data_ptr();
    a.index_dtype = it == ScalarType::Int ? IndexDtype::kInt32 : it == ScalarType::Long ? IndexDtype::kInt64
                                                                                           : IndexDtype::kBool;
    a.num_batches = static_cast<int32_t>(b);
    a.rows_per_batch = s;
  } else if (gate.dim() == 3 && gate.size(1) != 1) {
    const int64_t b = gate.size(0), s = gate.size(1);
    STD_TORCH_CHECK(b * s == a.rows, "qwen_fp4: per-token gate/scale/shift [B, S, D] need B * S = x's rows (",
                    a.rows, "), got shape ", shape_str(gate));
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

std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> s(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) s[d] = t.size(d);
  return s;
}

// Contiguous CUDA tensor on like's device. aoti_torch_empty_strided goes straight to the allocator,
// much cheaper per call than a boxed aten::new_empty through the dispatcher.
Tensor empty_cuda(const Tensor& like, const std::vector<int64_t>& sizes, int32_t dtype) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= sizes[d] > 0 ? sizes[d] : 1;
  }
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dtype,
                                           aoti_torch_device_type_cuda(), like.get_device_index(),
                                           &handle) == AOTI_TORCH_SUCCESS,
                  "qwen_fp4: allocating an output failed");
  return Tensor(handle);
}

Tensor new_bytes(const Tensor& like, int64_t rows, int64_t cols) {
  return empty_cuda(like, {rows, cols}, aoti_torch_dtype_uint8());
}

Tensor empty_like_bf16(const Tensor& x) { return empty_cuda(x, sizes_of(x), aoti_torch_dtype_bfloat16()); }

// The quantizing ops' outputs wired into the kernel arguments (ResnormArgs or QuantizeArgs): packed codes
// [rows, cols / 2] and the 128x4 scales [scale_rows(rows), cols / 16] (the kernels write the padding rows too).
template <class Args>
void set_quantized_outputs(Args& a, const Tensor& packed, const Tensor& scales, const Tensor& global_scale) {
  a.packed = static_cast<uint8_t*>(packed.data_ptr());
  a.scales = static_cast<uint8_t*>(scales.data_ptr());
  a.global_scale = static_cast<const float*>(global_scale.data_ptr());
}

// The functional quantizing ops' outputs, allocated: (packed, scales) for rows of cols.
std::pair<Tensor, Tensor> new_quantized_outputs(const Tensor& like, int64_t rows, int32_t cols) {
  return {new_bytes(like, rows, cols / 2), new_bytes(like, scale_rows(rows), cols / 16)};
}

// ---- The out-variants' outputs (the rules of validation.py's out-variant section) ----

// A caller-provided output: on like's CUDA device, of one of `dtypes`, of exactly `sizes`, contiguous,
// 16-byte aligned (the kernels store 16-byte vectors).
void check_output(const char* name, const Tensor& t, const Tensor& like, const char* like_name,
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
void check_quantized_outputs(const Tensor& packed, const Tensor& scales, const Tensor& like, const char* like_name,
                             int64_t rows, int32_t cols) {
  check_output("packed", packed, like, like_name, {ScalarType::Byte}, {rows, cols / 2});
  check_output("scales", scales, like, like_name, {ScalarType::Byte, ScalarType::Float8_e4m3fn},
               {scale_rows(rows), cols / 16});
}

// The bytes [begin, end) t's elements lie in (a strided view's gaps included); begin == end when empty.
struct ByteSpan {
  uintptr_t begin, end;
  bool overlaps(const ByteSpan& o) const { return begin < o.end && o.begin < end; }
};

ByteSpan byte_span(const Tensor& t) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  if (t.numel() == 0) return {begin, begin};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {begin, begin + static_cast<uintptr_t>(last + 1) * t.element_size()};
}

// The same memory, shape, strides and dtype: residual_out given as residual itself.
bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data_ptr() != b.data_ptr() || a.dim() != b.dim() || a.scalar_type() != b.scalar_type()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d) || a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// An argument by name; t == nullptr: an absent optional input.
struct NamedTensor {
  const char* name;
  const Tensor* t;
};

const Tensor* optional_ptr(const std::optional<Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// No output overlaps another output or an input, except that output `in_place_output` may be input
// `in_place_input` itself (same_view): the in-place residual update, safe because each kernel's thread
// reads its residual vectors before it stores them and no other CTA reads them (split_rows excludes it).
void check_no_overlap(std::initializer_list<NamedTensor> outputs, std::initializer_list<NamedTensor> inputs,
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

// The quantizing ops' kernel path on x's device, by the launch options (launch.h): auto takes the
// Blackwell path where usable, portable never, blackwell always (an error where it is not usable).
bool blackwell_path(const Tensor& x) {
  const KernelPath path = launch_options().kernel_path;
  const int device = x.get_device_index();
  if (path == KernelPath::kAuto) return blackwell_kernels_usable(device);
  if (path == KernelPath::kPortable) return false;
  STD_TORCH_CHECK(path == KernelPath::kBlackwell, "qwen_fp4: QWEN_FP4_KERNEL_PATH must be auto, portable or "
                  "blackwell (or unset) when qwen_resnorm_fp4 is imported; or pick the path with "
                  "qwen_resnorm_fp4.set_launch_options(kernel_path=...)");
  STD_TORCH_CHECK(blackwell_kernels_usable(device), "qwen_fp4: kernel path blackwell (QWEN_FP4_KERNEL_PATH or "
                  "set_launch_options), but the Blackwell path is not usable on cuda:", device, " (this build has "
                  "no Blackwell cubin for it); use auto or portable");
  return true;
}

}  // namespace

namespace {

// The one launch of each op, into outputs that were allocated (the functional ops) or checked (the
// out-variants).
void run_resnorm_quant(ResnormArgs& a, const Tensor& x, const Tensor& global_scale, bool fast_math,
                       int64_t nvfp4_4over6_code, const Tensor& packed, const Tensor& scales,
                       const Tensor& residual_out) {
  set_quantized_outputs(a, packed, scales, global_scale);
  a.residual_out = residual_out.data_ptr();
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  const LaunchTarget on = launch_target(x);
  if (blackwell_path(x)) launch_resnorm_quant_blackwell(a, fast_math, on);
  else launch_resnorm_quant_portable(a, fast_math, on);
}

void run_resnorm(ResnormArgs& a, const Tensor& x, const Tensor& y, const Tensor& residual_out) {
  a.y = y.data_ptr();
  a.residual_out = residual_out.data_ptr();
  launch_resnorm(a, launch_target(x));
}

// nvfp4_quantize's checks of y and global_scale, and its kernel arguments except the outputs.
QuantizeArgs make_quantize_args(const Tensor& y, const Tensor& global_scale) {
  check_cuda_tensor("y", y, y, /*vector_access=*/true, "y");
  check_dtype("y", y, false);
  const int32_t cols = check_cols("y", y);
  check_global_scale(global_scale, y, "y");
  QuantizeArgs a{};
  a.y = y.data_ptr();
  a.cols = cols;
  a.rows = check_rows("y", y, cols);
  return a;
}

void run_nvfp4_quantize(QuantizeArgs& a, const Tensor& y, const Tensor& global_scale, bool fast_math,
                        int64_t nvfp4_4over6_code, const Tensor& packed, const Tensor& scales) {
  set_quantized_outputs(a, packed, scales, global_scale);
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  const LaunchTarget on = launch_target(y);
  if (blackwell_path(y)) launch_nvfp4_quantize_blackwell(a, fast_math, on);
  else launch_nvfp4_quantize_portable(a, fast_math, on);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> resnorm_quant_cuda(const Tensor& residual, const Tensor& x,
                                                      const std::optional<Tensor>& bias, const Tensor& gate,
                                                      const Tensor& scale, const Tensor& shift,
                                                      const Tensor& global_scale, double eps, bool fast_math,
                                                      const std::optional<Tensor>& weight,
                                                      const std::optional<Tensor>& norm_bias,
                                                      const std::optional<Tensor>& modulate_index,
                                                      int64_t nvfp4_4over6_code) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  check_global_scale(global_scale, x);
  auto [packed, scales] = new_quantized_outputs(x, a.rows, a.cols);
  Tensor residual_out = empty_like_bf16(x);
  run_resnorm_quant(a, x, global_scale, fast_math, nvfp4_4over6_code, packed, scales, residual_out);
  return {packed, scales, residual_out};
}

void resnorm_quant_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                            const Tensor& gate, const Tensor& scale, const Tensor& shift, const Tensor& global_scale,
                            double eps, bool fast_math, const Tensor& packed, const Tensor& scales,
                            const Tensor& residual_out, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index,
                            int64_t nvfp4_4over6_code) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  check_global_scale(global_scale, x);
  check_quantized_outputs(packed, scales, x, "x", a.rows, a.cols);
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_no_overlap({{"packed", &packed}, {"scales", &scales}, {"residual_out", &residual_out}},
                   {{"residual", &residual}, {"x", &x}, {"bias", optional_ptr(bias)}, {"gate", &gate},
                    {"scale", &scale}, {"shift", &shift}, {"global_scale", &global_scale},
                    {"weight", optional_ptr(weight)}, {"norm_bias", optional_ptr(norm_bias)},
                    {"modulate_index", optional_ptr(modulate_index)}},
                   "residual_out", "residual");
  run_resnorm_quant(a, x, global_scale, fast_math, nvfp4_4over6_code, packed, scales, residual_out);
}

std::tuple<Tensor, Tensor> resnorm_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                        const Tensor& gate, const Tensor& scale, const Tensor& shift, double eps,
                                        const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                        const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  Tensor y = empty_like_bf16(x);
  Tensor residual_out = empty_like_bf16(x);
  run_resnorm(a, x, y, residual_out);
  return {y, residual_out};
}

void resnorm_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias, const Tensor& gate,
                      const Tensor& scale, const Tensor& shift, double eps, const Tensor& y,
                      const Tensor& residual_out, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  check_output("y", y, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_no_overlap({{"y", &y}, {"residual_out", &residual_out}},
                   {{"residual", &residual}, {"x", &x}, {"bias", optional_ptr(bias)}, {"gate", &gate},
                    {"scale", &scale}, {"shift", &shift}, {"weight", optional_ptr(weight)},
                    {"norm_bias", optional_ptr(norm_bias)}, {"modulate_index", optional_ptr(modulate_index)}},
                   "residual_out", "residual");
  run_resnorm(a, x, y, residual_out);
}

std::tuple<Tensor, Tensor> nvfp4_quantize_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math,
                                               int64_t nvfp4_4over6_code) {
  STD_TORCH_CHECK(y.is_cuda(), "qwen_fp4: y must be a CUDA tensor for the CUDA kernels");
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  QuantizeArgs a = make_quantize_args(y, global_scale);
  auto [packed, scales] = new_quantized_outputs(y, a.rows, a.cols);
  run_nvfp4_quantize(a, y, global_scale, fast_math, nvfp4_4over6_code, packed, scales);
  return {packed, scales};
}

void nvfp4_quantize_out_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math, const Tensor& packed,
                             const Tensor& scales, int64_t nvfp4_4over6_code) {
  STD_TORCH_CHECK(y.is_cuda(), "qwen_fp4: y must be a CUDA tensor for the CUDA kernels");
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  QuantizeArgs a = make_quantize_args(y, global_scale);
  check_quantized_outputs(packed, scales, y, "y", a.rows, a.cols);
  check_no_overlap({{"packed", &packed}, {"scales", &scales}}, {{"y", &y}, {"global_scale", &global_scale}});
  run_nvfp4_quantize(a, y, global_scale, fast_math, nvfp4_4over6_code, packed, scales);
}

void set_launch_options_op(int64_t kernel_path, bool pdl) {
  STD_TORCH_CHECK(kernel_path >= 0 && kernel_path <= static_cast<int64_t>(KernelPath::kInvalid),
                  "qwen_fp4: kernel_path must be a KernelPath code 0-3, got ", kernel_path);
  set_launch_options({static_cast<KernelPath>(kernel_path), pdl});
}

Tensor nvfp4_dequantize_bf16_cuda(const Tensor& packed, const Tensor& scales) {
  STD_TORCH_CHECK(packed.is_cuda(), "qwen_fp4: packed must be a CUDA tensor for the CUDA kernel");
  check_cuda_tensor("packed", packed, packed, /*vector_access=*/true, "packed");
  check_cuda_tensor("scales", scales, packed, /*vector_access=*/false, "packed");
  STD_TORCH_CHECK(packed.scalar_type() == ScalarType::Byte, "qwen_fp4: packed must be uint8, got ",
                  dtype_name(packed.scalar_type()));
  const ScalarType st = scales.scalar_type();
  STD_TORCH_CHECK(st == ScalarType::Byte || st == ScalarType::Float8_e4m3fn,
                  "qwen_fp4: scales must be uint8 or float8_e4m3fn, got ", dtype_name(st));
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(scales.data_ptr()) % 2 == 0,
                  "qwen_fp4: scales must be 2-byte aligned (a view at an odd offset? pass a copy)");
  STD_TORCH_CHECK(packed.dim() == 2, "qwen_fp4: packed must be [rows, K/2], got shape ", shape_str(packed));
  const int64_t rows = packed.size(0), cols = packed.size(1) * 2;
  STD_TORCH_CHECK(cols > 0 && cols % kColsMultiple == 0,
                  "qwen_fp4: packed.shape[1] * 2 (K) must be a positive multiple of ", kColsMultiple, ", got ", cols);
  STD_TORCH_CHECK(cols <= kMaxDequantizeCols, "qwen_fp4: packed.shape[1] * 2 (K) must be at most ",
                  kMaxDequantizeCols, ", got ", cols);
  STD_TORCH_CHECK(scales.numel() >= scale_rows(rows) * (cols / 16), "qwen_fp4: scales has ", scales.numel(),
                  " bytes, ", scale_rows(rows) * (cols / 16), " needed for ", rows, " rows of K = ", cols,
                  " in the 128x4 layout");
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  Tensor out = empty_cuda(packed, {rows, cols}, aoti_torch_dtype_bfloat16());
  launch_nvfp4_dequantize_bf16(static_cast<const uint8_t*>(packed.data_ptr()),
                               static_cast<const uint8_t*>(scales.data_ptr()), out.data_ptr(), rows,
                               static_cast<int32_t>(cols), current_stream(packed));
  return out;
}

}  // namespace qwen_fp4
