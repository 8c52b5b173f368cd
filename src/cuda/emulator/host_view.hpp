// What the host sees of the host-mapped words kernels store atomically, in late-store mode
// (PMOE_EMU_LATE_STORES=1). CUDA orders a kernel thread's stores to host-mapped memory for a host
// reader only through a release of system scope (a release store, or a __threadfence_system() or
// __threadfence() then an atomic write) that the host's load acquires, or through the host's
// synchronisation with the kernel; a relaxed store may reach the host before the thread's earlier
// ones. One x86 memory image shows them in order, so the order the host sees is kept here:
//
//   a kernel thread f stores X     (a cuda::atomic_ref store or read-modify-write of system scope
//                                  to host-mapped memory): X's new value is in memory at once (a
//                                  host that spins on X sees it), and f's earlier stores of this
//                                  kind that the host has not read yet are overtaken: the host's
//                                  loads of them return the value before until
//   the host acquires at Y          (a cuda::atomic_ref load with acquire) where f released after
//                                  them (a release store at Y, or a fence of f then its store at Y)
//   the host synchronises           (stream, event or device sync, or a query that finds them done)
//   a second passes                 (stores reach the host in finite time)
//
// The host's loads of such words must be cuda::atomic_ref loads (atomic.hpp) to be judged;
// std::atomic_ref and plain reads see memory: everything in order (never stricter than CUDA).
// A host synchronisation shows the host every kernel's stores, not only its stream's (weaker than
// CUDA, never stricter).
#pragma once

#include <cstddef>

namespace pmoe::emu {

bool is_host_mapped(const void* p);  // in memory from cudaHostAlloc (memory.cpp)

// Kernel thread, before its atomic write of system scope at `at`; `before` holds the value there.
void host_view_store(void* at, const void* before, size_t bytes, bool releases);
// Kernel thread: __threadfence() or __threadfence_system() (its next store at a location of
// host-mapped memory releases its earlier ones there).
void host_view_fence();
// Host thread, after its atomic load of `at` read `value`: replaces it by what the host may see.
void host_view_load(const void* at, void* value, size_t bytes, bool acquires);
// The host synchronised with the device: it sees every store from now on.
void host_view_synchronized();

}  // namespace pmoe::emu
