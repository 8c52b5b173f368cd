// What the host code needs from a device runtime, without CUDA headers: memory, copies,
// streams. src/cuda/device_runtime.cu implements it where CUDA is built; otherwise
// src/core/device_runtime_none.cpp throws a pmoe::Error saying so.
#pragma once

#include <cstddef>

#include "pmoe/stream.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::detail {

void* device_alloc(Device device, size_t bytes);  // zeroed
void device_free(Device device, void* p);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void set_device(Device device);                   // for the calling thread
Stream create_stream(Device device);
void destroy_stream(Stream stream);

// CUDA IPC: a handle that another process on the node opens to map `p` (from device_alloc).
constexpr size_t kIpcHandleBytes = 64;
void ipc_handle(void* p, void* handle_out);          // writes kIpcHandleBytes
void* ipc_open(Device device, const void* handle);   // the peer's memory, mapped here
void ipc_close(void* p);                             // never throws

}  // namespace pmoe::detail
