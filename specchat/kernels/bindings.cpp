// The compiled module's Python face: the w4a8 product and its code paths (q4_kernel.cpp), the lean
// forward's layer loop (lean_layers.cpp), and sampling's probabilities (sampling.cpp). Built by build.py.
#include "module.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  register_lean_layers(module);
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
  module.def("tile_group_blocks", &tile_group_blocks, "a GGUF's blocks of one group written into the kernel's tiles",
             pybind11::arg("raw"), pybind11::arg("kind"), pybind11::arg("qs"), pybind11::arg("m"), pybind11::arg("d"),
             pybind11::arg("dmin"), pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("top_p_probs", &top_p_probs, "sampling probabilities: temperature, top-k, top-p", pybind11::arg("logits"),
             pybind11::arg("temperature"), pybind11::arg("top_k"), pybind11::arg("top_p"),
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("greedy_rows", &greedy_rows, "each row's argmax (the first of equal maxima) and log-sum-exp",
             pybind11::arg("logits"), pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("kernel_path", &kernel_path, "the code path the product runs");
  module.def("kernel_paths", &kernel_paths, "the code paths this CPU can run, fastest first");
  module.def("set_kernel_path", &set_kernel_path, "run the product on this path (a name of kernel_paths())");
}
