// Python bindings of tierserve's CPU kernels (built by tierserve.kernels.build).
#include <torch/extension.h>

#include "parallel.h"
#include "qweight.h"

namespace tierserve {
void linear_into(const at::Tensor& a, const at::Tensor& w_t, const c10::optional<at::Tensor>& bias,
                 at::Tensor& out, bool accumulate);
void qweight_dequantize_into(const QWeight& w, at::Tensor& out);
void qweight_columns_into(const QWeight& w, const at::Tensor& ids, at::Tensor& out);
bool supported(int64_t group, int64_t head_dim, int64_t block_size);
void paged_attention_into(const at::Tensor& q, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& tables,
                          const at::Tensor& segments, double scale, at::Tensor& out);
at::Tensor gumbel_argmax(const at::Tensor& logits, const at::Tensor& keys);
std::tuple<at::Tensor, at::Tensor> argmax_logsumexp(const at::Tensor& logits);
int64_t vector_lanes();
void decoder_layer(at::Tensor& x, const QWeight& w_qkv, const c10::optional<at::Tensor>& b_qkv,
                   const QWeight& w_o, const QWeight& w_gate_up, const QWeight& w_down,
                   const at::Tensor& ln_attn, const at::Tensor& ln_mlp, const at::Tensor& cos,
                   const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slots, const at::Tensor& tables, const at::Tensor& segments,
                   int64_t heads, double eps);
void decoder_attention(const at::Tensor& x, const QWeight& w_qkv,
                       const c10::optional<at::Tensor>& b_qkv, const QWeight& w_o,
                       const at::Tensor& ln_attn, const at::Tensor& cos, const at::Tensor& sin,
                       at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                       const at::Tensor& tables, const at::Tensor& segments, int64_t heads,
                       double eps, at::Tensor& out, bool add);
void decoder_mlp(const at::Tensor& x, const QWeight& w_gate_up, const QWeight& w_down,
                 const at::Tensor& ln_mlp, double eps, at::Tensor& out, bool add);
}  // namespace tierserve

// Every kernel releases the GIL while it runs, as PyTorch's own ops do: the server's event loop
// (health checks, streaming) keeps running beside a long prefill GEMM.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using release = py::call_guard<py::gil_scoped_release>;
  using tierserve::QWeight;
  py::class_<QWeight>(m, "QWeight", "a [K, N] weight: float32 (format 0), q8 (1) or q4 (2)")
      .def(py::init<int64_t, at::Tensor, c10::optional<at::Tensor>, c10::optional<at::Tensor>,
                    bool, bool>(),
           py::arg("fmt"), py::arg("q"), py::arg("d") = py::none(), py::arg("m") = py::none(),
           py::arg("bf16") = false, py::arg("int8") = false)
      .def_readonly("bf16", &QWeight::bf16)
      .def_readonly("int8", &QWeight::int8)
      .def_readonly("released", &QWeight::released)
      .def_property_readonly("nbytes", [](const QWeight& w) {
        int64_t n = 0;
        for (const at::Tensor* t : {&w.q, &w.d, &w.m, &w.i8})
          if (t->defined()) n += t->numel() * t->element_size();
        return n;
      })
      .def_readonly("fmt", &QWeight::fmt)
      .def_readonly("K", &QWeight::K)
      .def_readonly("N", &QWeight::N)
      .def_readonly("q", &QWeight::q)
      .def_readonly("d", &QWeight::d)
      .def_readonly("m", &QWeight::m)
      .def_property_static(
          "panel_min_rows", [](py::object) { return QWeight::panel_min_rows; },
          [](py::object, int64_t v) { QWeight::panel_min_rows = v; })
      .def_static("bf16_available", &QWeight::bf16_available)
      .def_static("int8_available", &QWeight::int8_available);
  m.def("linear_into", &tierserve::linear_into, "out (+)= a @ w_t (+ bias)", release());
  m.def("weight_linear_into", &tierserve::weight_linear_into, "out (+)= a @ W (+ bias), any format",
        release());
  m.def("dequantize_into", &tierserve::qweight_dequantize_into, "a quantized weight as float32",
        release());
  m.def("columns_into", &tierserve::qweight_columns_into, "columns of a quantized weight as rows",
        release());
  m.def("attention_supported", &tierserve::supported, "(group, head_dim, block) -> bool",
        release());
  m.def("paged_attention_into", &tierserve::paged_attention_into, "attention by segments",
        release());
  m.def("gumbel_argmax", &tierserve::gumbel_argmax, "seeded Gumbel-max draw per row", release());
  m.def("argmax_logsumexp", &tierserve::argmax_logsumexp, "(argmax, logsumexp) per row",
        release());
  m.def("decoder_layer", &tierserve::decoder_layer, "one decoder layer, x in place", release());
  m.def("decoder_attention", &tierserve::decoder_attention,
        "a layer's attention half: its o product into out (added with add)", release());
  m.def("decoder_mlp", &tierserve::decoder_mlp,
        "a layer's MLP half: its down product into out (added with add)", release());
  m.def("set_kernel_threads", &tierserve::set_kernel_threads,
        "threads the kernels' parallel regions use, the caller included", release());
  m.def("kernel_threads", &tierserve::kernel_threads, "threads the kernels use", release());
  m.def("vector_lanes", &tierserve::vector_lanes, "float lanes per SIMD vector", release());
}
