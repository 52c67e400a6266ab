// The kernel module's Python side: what bindings.cpp registers of lean_layers.cpp. <torch/csrc/utils/pybind.h>
// (pybind11 and torch's tensor casters) rather than <torch/python.h> or <torch/extension.h>, which add torch's C++
// frontend: 6 s a file against 12 and 18 here.
#pragma once
#include <torch/csrc/utils/pybind.h>

#include "q4/q4_kernel.h"

void register_lean_layers(pybind11::module& module);  // lean_layers.cpp
