// The kernel module's Python side: what bindings.cpp registers of lean_layers.cpp. <torch/python.h> (pybind11
// and torch's casters) rather than <torch/extension.h>, which adds the whole C++ frontend (12 s against 18 here).
#pragma once
#include <torch/python.h>

#include "q4/q4_kernel.h"

void register_lean_layers(pybind11::module& module);  // lean_layers.cpp
