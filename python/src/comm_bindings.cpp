// Communicators: thread ranks through run_ranks(n, fn), MPI processes through mpi_world() (in a
// build with MPI: PMOE_HAVE_MPI, set by python/CMakeLists.txt).
#if PMOE_HAVE_MPI
#include <mpi.h>
#endif

#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "bindings.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#if PMOE_HAVE_MPI
#include "pmoe/mpi_communicator.hpp"
#endif
#include "pmoe/stream.hpp"
#include "tensor_interop.hpp"

namespace pmoe::python {

namespace nb = nanobind;

namespace {

#if PMOE_HAVE_MPI
// MPI is started on first use and stopped when the interpreter exits.
void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }));
}
#endif

}  // namespace

void bind_comm(nb::module_& m) {
  nb::class_<Communicator>(m, "Communicator",
                           "One rank's view of a group of ranks (threads or MPI processes).")
      .def_prop_ro("rank", &Communicator::rank, "this rank, in [0, size)")
      .def_prop_ro("size", &Communicator::size, "the number of ranks")
      .def("barrier", &Communicator::barrier, nb::call_guard<nb::gil_scoped_release>(),
           "Returns once every rank has called it; raises pmoe.Error on timeout.")
      .def_prop_ro("device", [](const Communicator& c) { return c.device().str(); },
                   "'cpu' or 'cuda:N'")
      .def_prop_ro(
          "stream", [](const Communicator& c) { return uintptr_t(c.stream().handle); },
          "This rank's cudaStream_t as an integer (0 on the CPU), e.g. for "
          "torch.cuda.ExternalStream.")
      .def(
          "synchronize", [](const Communicator& c) { synchronize(c.stream()); },
          nb::call_guard<nb::gil_scoped_release>(),
          "Waits until everything pmoe enqueued on this rank's stream has run (nothing to wait "
          "for on the CPU).");

#if PMOE_HAVE_MPI
  nb::class_<MpiCommunicator, Communicator>(m, "MpiCommunicator");

  m.def(
      "mpi_world",
      [] {
        ensure_mpi();
        return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
      },
      "A communicator over all MPI processes (run the script under mpirun). Starts MPI if "
      "needed and stops it at exit.");
#else
  m.def(
      "mpi_world",
      []() -> std::unique_ptr<Communicator> {
        throw Error(
            "pmoe.mpi_world: this pmoe was built without MPI (PMOE_MPI=OFF, or no MPI found "
            "when it was built); under torchrun use pmoe.torch.communicator(), or rebuild with "
            "MPI installed (scripts/setup.sh)");
      },
      "A communicator over all MPI processes; this build has no MPI, so it raises pmoe.Error.");
#endif
  m.attr("has_mpi") = bool(PMOE_HAVE_MPI);

  m.def(
      "run_ranks",
      [](int n, nb::callable fn, const std::string& device) {
        const Device where = parse_device(device);
        nb::gil_scoped_release release;  // the rank threads need the GIL to run fn
        run_ranks(
            n,
            [&](Communicator& comm) {
              nb::gil_scoped_acquire acquire;
              try {
                fn(nb::cast(&comm, nb::rv_policy::reference));
              } catch (nb::python_error& e) {
                // The exception itself travels on (run_ranks re-throws the first rank's error
                // here, and nanobind restores it): the caller catches the rank's own type, with
                // the traceback through fn. The note says which thread raised it.
                nb::object note = nb::getattr(e.value(), "add_note", nb::none());
                if (!note.is_none())
                  note(nb::str("raised on rank {} of {} (pmoe.run_ranks)")
                           .format(comm.rank(), comm.size()));
                throw;
              }
            },
            where);
      },
      nb::arg("n"), nb::arg("fn"), nb::arg("device") = "cpu",
      "Runs fn(comm) on n ranks, each a thread of this process, and returns when all have "
      "returned. If a rank raises, the others stop waiting at once, and the exception of the "
      "first rank to fail is raised here as it was: a ValueError stays a ValueError, with its "
      "traceback through fn and a note naming the rank (the other ranks' errors, which follow "
      "from it, are not raised). `comm` is valid only during fn. device: 'cpu', or 'cuda:N' "
      "for n ranks sharing GPU N (each with its own stream, comm.stream).");

  m.def("cuda_available", [] { return cuda_available_in_build() && cuda_device_count() > 0; },
        "True when device='cuda:N' can run: a GPU is visible, or pmoe's emulated CUDA device "
        "stands in for one (see cuda_emulated). Emulated, torch.cuda.is_available() is False "
        "and neither torch nor NumPy can allocate there: ops on 'cuda:N' then take only pmoe's "
        "own arrays (pmoe.zeros, filled by pmoe.copy); torch CUDA tensors need a GPU.");
  m.def("cuda_emulated", &cuda_emulated,
        "True when 'cuda:N' runs on pmoe's emulated CUDA device (the kernels' own source on the "
        "CPU): no GPU is visible, or PMOE_CUDA_EMULATE=1. It proves logic, not speed.");
}

}  // namespace pmoe::python
