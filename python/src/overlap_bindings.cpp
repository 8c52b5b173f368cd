// AllGatherGemm and GemmReduceScatter: tensor-parallel GEMMs with their communication overlapped.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"
#include "pmoe/error.hpp"
#include "pmoe/overlap.hpp"
#include "tensor_interop.hpp"

namespace pmoe::python {

namespace nb = nanobind;

namespace {

OverlapConfig make_config(int64_t m, int64_t n, int64_t k, const std::string& dtype, int chunks,
                          const std::string& order, int64_t min_overlap_bytes) {
  OverlapConfig c;
  c.m = m;
  c.n = n;
  c.k = k;
  c.dtype = parse_dtype(dtype);
  c.chunks = chunks;
  if (order == "all_pairs") {
    c.order = OverlapOrder::all_pairs;
  } else if (order == "ring") {
    c.order = OverlapOrder::ring;
  } else {
    throw Error("order must be 'all_pairs' or 'ring', got '" + order + "'");
  }
  c.min_overlap_bytes = min_overlap_bytes;
  return c;
}

// Binds one op class: constructor (collective), run, run_serial, overlaps, workspace_bytes.
template <typename Op>
void bind_op(nb::module_& m, const char* name, const char* doc) {
  nb::class_<Op>(m, name, doc)
      .def(
          "__init__",
          [](Op* self, Communicator& comm, int64_t m_, int64_t n, int64_t k,
             const std::string& dtype, int chunks, const std::string& order,
             int64_t min_overlap_bytes) {
            const OverlapConfig c = make_config(m_, n, k, dtype, chunks, order, min_overlap_bytes);
            nb::gil_scoped_release release;
            new (self) Op(comm, c, comm.device());
          },
          nb::arg("comm"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::kw_only(),
          nb::arg("dtype") = "bf16", nb::arg("chunks") = 0, nb::arg("order") = "all_pairs",
          nb::arg("min_overlap_bytes") = int64_t(1) << 20, nb::keep_alive<1, 2>(),
          "Collective. m, n, k: the global sizes; dtype f32, f16 or bf16 (uint16 bits in NumPy); "
          "chunks: pieces in the pipeline, a multiple of the ranks (0: one per rank); order: "
          "'all_pairs' or 'ring'. On a CUDA communicator the op runs on its device: arrays "
          "there, C ready after comm.synchronize(); keep A, B and C alive until then.")
      .def(
          "run",
          [](Op& self, nb::handle a, nb::handle b, nb::handle c) {
            const Tensor ta = to_tensor(a, "A"), tb = to_tensor(b, "B"), tc = to_tensor(c, "C");
            nb::gil_scoped_release release;
            self.run(ta, tb, tc);
          },
          nb::arg("A"), nb::arg("B"), nb::arg("C"), "The overlapped op. Collective.")
      .def(
          "run_serial",
          [](Op& self, nb::handle a, nb::handle b, nb::handle c) {
            const Tensor ta = to_tensor(a, "A"), tb = to_tensor(b, "B"), tc = to_tensor(c, "C");
            nb::gil_scoped_release release;
            self.run_serial(ta, tb, tc);
          },
          nb::arg("A"), nb::arg("B"), nb::arg("C"),
          "The baseline: the whole collective, then the GEMM (or the GEMM, then the collective).")
      .def("overlaps", &Op::overlaps, "True when run() moves data on a communication thread.")
      .def("workspace_bytes", &Op::workspace_bytes, "Bytes this op allocated per rank.");
}

}  // namespace

void bind_overlap(nb::module_& m) {
  bind_op<AllGatherGemm>(m, "AllGatherGemm", R"(C_r = all_gather_rows(A) . B_r.

A [m / W, k] (this rank's rows), B [k, n / W] (this rank's columns), C [m, n / W] out.)");
  bind_op<GemmReduceScatter>(m, "GemmReduceScatter", R"(C_r = rows r*m/W.. of sum_s A_s . B_s.

A [m, k / W], B [k / W, n] (this rank's slice of K), C [m / W, n] out.)");
}

}  // namespace pmoe::python
