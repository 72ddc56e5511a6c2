// npu_fusion_attention's common cases in C++ (op_plugin/attention/fusion.py
// calls them first): the calls its Python fast paths take.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace torch_npu::kernels {

// (attention_out, softmax_max, softmax_sum, softmax_out (empty), numels), or
// nullopt when the call is not one this path takes (then the Python engine
// runs it, and raises its errors): float32/float16/bfloat16 inputs of one
// dtype, layout BSH/SBH/BSND/BNSD with consistent shapes, no atten_mask
// (full attention) or sparse_mode 2 / 3 with S1 == S2 and scale > 0
// (top-left causal), non-empty sequences, Dv == D. The caller has already ruled out pse,
// dropout, prefix, varlen lengths, padding_mask, sink and dropout_mask.
// `chunk_elements` is flash.CHUNK_ELEMENTS (the row max's blocks).
using FusionAttentionResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t>;
std::optional<FusionAttentionResult> fusion_attention_sdpa(const at::Tensor& query, const at::Tensor& key,
                                                           const at::Tensor& value, int64_t head_num,
                                                           const std::string& input_layout,
                                                           const std::optional<at::Tensor>& atten_mask,
                                                           double scale, int64_t sparse_mode,
                                                           int64_t chunk_elements);

// The same calls with dropout (0 < keep_prob < 1) when small enough for one
// block (at most `small_elements` logits, one row block of `chunk_elements`):
// whether this path takes it, and flash.small_dropout_attention's formula op
// for op, with dropout_mask.keep_rows's keep mask for (seed, offset). The
// caller draws the pair between the two calls, as the Python engine draws it
// after its checks, so a call this path refuses leaves the generator alone.
bool fusion_attention_small_dropout_applies(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                            int64_t head_num, const std::string& input_layout,
                                            const std::optional<at::Tensor>& atten_mask, double scale,
                                            int64_t sparse_mode, int64_t chunk_elements,
                                            int64_t small_elements);
FusionAttentionResult fusion_attention_small_dropout(const at::Tensor& query, const at::Tensor& key,
                                                     const at::Tensor& value, int64_t head_num,
                                                     const std::string& input_layout,
                                                     const std::optional<at::Tensor>& atten_mask, double scale,
                                                     int64_t sparse_mode, double keep_prob, int64_t seed,
                                                     int64_t offset);

// npu::npu_fusion_attention's C++ kernel (registered here at AutogradCPU and
// AutogradPrivateUse1) takes fusion_attention_sdpa's calls with keep_prob == 1, and
// fusion_attention_small_dropout's calls on npu tensors (drawing seed/offset from the
// device's generator as the Python kernel does), before the Python kernel runs. It reads
// flash.CHUNK_ELEMENTS and flash.SMALL_ELEMENTS through `reader`, which the Python layer
// installs (tests patch those attributes); until then every call goes to the Python kernel.
struct FlashSizes {
  int64_t chunk_elements;
  int64_t small_elements;
};
void set_flash_sizes_reader(FlashSizes (*reader)());

}  // namespace torch_npu::kernels
