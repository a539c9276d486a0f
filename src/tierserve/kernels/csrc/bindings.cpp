// Python bindings of tierserve's CPU kernels (built by tierserve.kernels.build).
#include <torch/extension.h>

namespace tierserve {
void linear_into(const at::Tensor& a, const at::Tensor& w_t, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out, bool accumulate);
bool supported(int64_t group, int64_t head_dim, int64_t block_size);
void paged_attention_into(const at::Tensor& q, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& tables,
                          const at::Tensor& segments, double scale, at::Tensor& out);
at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& keys);
int64_t vector_lanes();
void decoder_layer(at::Tensor& x, const at::Tensor& w_qkv, const c10::optional<at::Tensor>& b_qkv,
                   const at::Tensor& w_o, const at::Tensor& w_gate_up, const at::Tensor& w_down,
                   const at::Tensor& ln_attn, const at::Tensor& ln_mlp, const at::Tensor& cos,
                   const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slots, const at::Tensor& tables, const at::Tensor& segments,
                   int64_t heads, double eps);
}  // namespace tierserve

// Every kernel releases the GIL while it runs, as PyTorch's own ops do: the server's event loop
// (health checks, streaming) keeps running beside a long prefill GEMM.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("linear_into", &tierserve::linear_into, "out (+)= a @ w_t (+ bias)", release());
  m.def("attention_supported", &tierserve::supported, "(group, head_dim, block) -> bool",
        release());
  m.def("paged_attention_into", &tierserve::paged_attention_into, "attention by segments",
        release());
  m.def("gumbel_argmax", &tierserve::gumbel_argmax, "seeded Gumbel-max draw per row", release());
  m.def("decoder_layer", &tierserve::decoder_layer, "one decoder layer, x in place", release());
  m.def("vector_lanes", &tierserve::vector_lanes, "float lanes per SIMD vector", release());
}
