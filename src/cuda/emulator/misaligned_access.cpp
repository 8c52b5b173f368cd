// A misaligned access on the emulated device is fatal, as on a GPU.
//
// On a GPU a 16-, 8-, 4- or 2-byte load or store at an address that is not a multiple of its
// alignment faults ("misaligned address", a sticky error that ends the context). x86 forgives it,
// so a kernel whose vector copy reads a misaligned row would pass every test here and fault on
// the first GPU. Two checks close that gap (docs/emulated-device.md, "Alignment"):
//   - the kernels' translation units are compiled with UBSan's alignment check, fatal
//     (-fsanitize=alignment -fno-sanitize-recover=alignment, src/cuda/emulator/CMakeLists.txt):
//     before each typed load or store the compiler compares the address with the type's
//     alignment (int4: 16, as CUDA's __align__(16); runtime_api.hpp) and calls the handler below;
//   - store_to_peer()'s emulated store (late_stores.hpp's store_late) checks its own address,
//     since a held store is written later, bytewise, where no typed access is left to check.
// Both print where and what, and abort: a misaligned access is a bug of pmoe's kernels, never a
// user's mistake (every kernel copies rows of any alignment through the byte or narrow-word paths
// of its copy helpers), and a GPU would not let the kernel go on either.
//
// The UBSan handler is ours, not UBSan's runtime, so that no build, installed library or Python
// module needs a sanitizer runtime: its two entry points take the compiler's record (file, line,
// column, type, alignment; the layout GCC and Clang have both emitted for the "_v1" handlers
// since 2017). Sanitizer builds (PMOE_SANITIZE=address) compile it out
// (PMOE_EMU_UBSAN_HANDLER=0): -fsanitize=undefined brings UBSan's own, which checks alignment as
// fatally.
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda/emulator/late_stores.hpp"

namespace pmoe::emu {

namespace {
constexpr const char* kGpuWouldFault = "a GPU faults here: cudaErrorMisalignedAddress";
}

void misaligned_store(const void* dst, size_t bytes, size_t alignment) {
  std::fprintf(stderr,
               "pmoe emulated device: misaligned address: store_to_peer of %zu bytes to %p, "
               "which requires %zu-byte alignment (%s)\n",
               bytes, dst, alignment, kGpuWouldFault);
  std::fflush(stderr);
  std::abort();
}

}  // namespace pmoe::emu

#if PMOE_EMU_UBSAN_HANDLER
namespace {

struct SourceLocation {
  const char* file;
  uint32_t line;
  uint32_t column;
};
struct TypeDescriptor {
  uint16_t kind;
  uint16_t info;
  char name[1];
};
struct TypeMismatchData {
  SourceLocation location;
  const TypeDescriptor* type;
  unsigned char log_alignment;
  unsigned char check_kind;  // what the access was: a load, a store, a member access, ...
};

const char* access_kind(unsigned char kind) {
  static const char* const kinds[] = {"load of",       "store to",       "reference binding to",
                                      "member access within", "member call on",
                                      "constructor call on"};
  return kind < sizeof(kinds) / sizeof(kinds[0]) ? kinds[kind] : "access to";
}

[[noreturn]] void misaligned(const TypeMismatchData* data, uintptr_t address) {
  const SourceLocation& at = data->location;
  std::fprintf(stderr,
               "%s:%u:%u: pmoe emulated device: misaligned address: %s 0x%" PRIxPTR
               " for type %s, which requires %u-byte alignment (%s)\n",
               at.file ? at.file : "<unknown>", at.line, at.column, access_kind(data->check_kind),
               address, data->type ? data->type->name : "?", 1u << data->log_alignment,
               ::pmoe::emu::kGpuWouldFault);
  std::fflush(stderr);
  std::abort();
}

}  // namespace

// The compiler's calls (UBSan's ABI: the names and arguments are fixed by it).
extern "C" {
void __ubsan_handle_type_mismatch_v1(const TypeMismatchData* data, uintptr_t pointer) {
  misaligned(data, pointer);
}
void __ubsan_handle_type_mismatch_v1_abort(const TypeMismatchData* data, uintptr_t pointer) {
  misaligned(data, pointer);
}
}
#endif
