// SocketCommunicator: ranks of a job started by another launcher (torchrun). pmoe.torch builds it;
// these are the two steps it needs around its own address exchange.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "tensor_interop.hpp"
#include "pmoe/socket_communicator.hpp"

namespace pmoe::python {

namespace nb = nanobind;

void bind_socket(nb::module_& m) {
  nb::class_<SocketCommunicator::Listener>(
      m, "SocketListener",
      "A listening TCP socket (port chosen by the kernel) for a SocketCommunicator.")
      .def(nb::init<const std::string&>(), nb::arg("bind_host") = "0.0.0.0")
      .def_prop_ro("port", &SocketCommunicator::Listener::port);

  nb::class_<SocketCommunicator, Communicator>(m, "SocketCommunicator",
                                               R"(Ranks connected by pmoe's own TCP mesh.

Collective: listener is this rank's SocketListener (taken over), addresses[r] rank r's
"host:port", nodes[r] rank r's node name (equal names share memory), job_id one string for the
whole job, device "cpu" or this process's GPU "cuda:N" (symmetric memory on it, shared with the
node's processes through CUDA IPC; ops run on comm.stream). Every rank must pass the same lists
and kind of device; pmoe.torch.communicator() fills them in.)")
      .def(
          "__init__",
          [](SocketCommunicator* self, SocketCommunicator::Listener& listener, int rank,
             std::vector<std::string> addresses, std::vector<std::string> nodes,
             std::string job_id, const std::string& device) {
            const Device where = parse_device(device);
            nb::gil_scoped_release release;  // collective: peers are connecting too
            new (self) SocketCommunicator(std::move(listener), rank, std::move(addresses),
                                          std::move(nodes), std::move(job_id), where);
          },
          nb::arg("listener"), nb::arg("rank"), nb::arg("addresses"), nb::arg("nodes"),
          nb::arg("job_id"), nb::arg("device") = "cpu")
      .def(
          "all_gather",
          [](SocketCommunicator& c, nb::bytes mine) {
            const std::string text(mine.c_str(), mine.size());
            std::vector<std::byte> all;
            {
              nb::gil_scoped_release release;
              all = c.all_gather(std::as_bytes(std::span(text.data(), text.size())));
            }
            std::vector<nb::bytes> out;
            for (int r = 0; r < c.size(); ++r)
              out.emplace_back(reinterpret_cast<const char*>(all.data()) + size_t(r) * text.size(),
                               text.size());
            return out;
          },
          nb::arg("mine"),
          "Set-up only: every rank's bytes (the same length on every rank), in rank order.")
      .def_static(
          "replacing",
          [](SocketCommunicator::Listener& listener, int rank, std::vector<std::string> addresses,
             std::vector<std::string> nodes, std::string job_id, const std::string& device) {
            const Device where = parse_device(device);
            nb::gil_scoped_release release;  // the survivors admit it meanwhile
            return SocketCommunicator::replacing(std::move(listener), rank, std::move(addresses),
                                                 std::move(nodes), std::move(job_id), where);
          },
          nb::arg("listener"), nb::arg("rank"), nb::arg("addresses"), nb::arg("nodes"),
          nb::arg("job_id"), nb::arg("device") = "cpu",
          "A new process in the place of `rank`, whose process ended, while every other rank "
          "calls admit(rank): the constructor's arguments, with addresses[rank] this process's "
          "own listener's. One node's CPU only (docs/robustness.md).")
      .def(
          "admit",
          [](SocketCommunicator& c, int rank) {
            nb::gil_scoped_release release;  // waits for the newcomer's connection
            c.admit(rank);
          },
          nb::arg("rank"),
          "Every other rank, between calls: takes the connection of the process now in `rank`'s "
          "place; then each op's admit(rank). Raises pmoe.Error, changing nothing, for a rank "
          "whose process lives.")
      .def_prop_ro("node_ranks", &SocketCommunicator::node_ranks,
                   "The ranks (ascending, this one included) that share memory with this one.");
}

}  // namespace pmoe::python
