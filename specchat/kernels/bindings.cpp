// The compiled module's Python face: the w4a8 product and its code paths (q4_kernel.cpp), the lean
// forward's layer loop (lean_layers.cpp), and sampling's probabilities (sampling.cpp). Built by build.py.
// The only source that includes the Python side: <torch/csrc/utils/pybind.h> (pybind11 and torch's tensor casters)
// rather than <torch/python.h> or <torch/extension.h>, which add torch's C++ frontend (6 s a file against 12 and 18).
#include <torch/csrc/utils/pybind.h>

#include "lean_layers.h"
#include "q4/q4_kernel.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  pybind11::class_<LeanLayers>(module, "LeanLayers", pybind11::module_local())
      .def(pybind11::init<int64_t, int64_t, int64_t, double>())
      .def("add_layer", &LeanLayers::add_layer)
      .def("__len__", &LeanLayers::size)
      .def("add_head_norms", &LeanLayers::add_head_norms)
      .def("add_sandwich_norms", &LeanLayers::add_sandwich_norms)
      .def("set_layer_attention", &LeanLayers::set_layer_attention)
      .def("set_activation", &LeanLayers::set_activation)
      .def("set_softcap", &LeanLayers::set_softcap)
      .def("set_final_norm", &LeanLayers::set_final_norm)
      .def("forward", &LeanLayers::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("forward_tail", &LeanLayers::forward_tail, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("time_parts", &LeanLayers::time_parts)
      .def("part_seconds", &LeanLayers::part_seconds);
  module.def("q4_linear", &q4_linear, "4-bit weights x 8-bit activations, batch-invariant", pybind11::arg("x"),
             pybind11::arg("qs"), pybind11::arg("sc"), pybind11::arg("m"), pybind11::arg("d"), pybind11::arg("dmin"),
             pybind11::arg("outs") = -1, pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("q4_linear_parts", &q4_linear_parts, "the products of several w4a8 weights side by side, x quantized once",
             pybind11::arg("x"), pybind11::arg("weights"), pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("tile_q4_k", &tile_q4_k, "a GGUF's Q4_K (or Q5_K) blocks written into the kernel's tiles",
             pybind11::arg("raw"), pybind11::arg("fifth_bits"), pybind11::arg("qs"), pybind11::arg("sc"), pybind11::arg("m"), pybind11::arg("d"), pybind11::arg("dmin"),
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("tile_q6_k", &tile_q6_k, "a GGUF's Q6_K blocks written into the kernel's tiles", pybind11::arg("raw"),
             pybind11::arg("qs"), pybind11::arg("sc"), pybind11::arg("m"), pybind11::arg("d"), pybind11::arg("dmin"),
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("tile_iq4_xs", &tile_iq4_xs, "a GGUF's IQ4_XS blocks written into the kernel's tiles", pybind11::arg("raw"),
             pybind11::arg("qs"), pybind11::arg("sc"), pybind11::arg("m"), pybind11::arg("d"), pybind11::arg("dmin"),
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("tile_group_blocks", &tile_group_blocks, "a GGUF's blocks of one group written into the kernel's tiles",
             pybind11::arg("raw"), pybind11::arg("kind"), pybind11::arg("qs"), pybind11::arg("m"), pybind11::arg("d"),
             pybind11::arg("dmin"), pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("top_p_probs", &top_p_probs, "sampling probabilities: temperature, top-k, top-p", pybind11::arg("logits"),
             pybind11::arg("temperature"), pybind11::arg("top_k"), pybind11::arg("top_p"),
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("greedy_rows", &greedy_rows, "each row's argmax (the first of equal maxima) and log-sum-exp",
             pybind11::arg("logits"), pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("kernel_path", &kernel_path, "the code path the product runs");
  module.def("kernel_paths", &kernel_paths, "the code paths this build holds and this CPU runs, fastest first");
  module.def("set_kernel_path", &set_kernel_path, "run the product on this path (a name of kernel_paths())");
}
