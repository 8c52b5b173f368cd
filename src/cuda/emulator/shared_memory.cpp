// This thread's copies of the kernels' `__shared__` variables, found through the module's symbol
// table and TLS block (shared_memory.hpp says why and which).
#include "cuda/emulator/shared_memory.hpp"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pmoe::emu {
namespace {

struct SharedVariable {
  size_t offset;  // in the module's TLS block
  size_t bytes;
};

struct Module {
  std::string path;  // "" until found
  size_t tls_bytes = 0;
};

// The module holding this function: its file and the size of its TLS block.
int find_this_module(dl_phdr_info* info, size_t, void* out) {
  const auto self = reinterpret_cast<uintptr_t>(&find_this_module);
  bool mine = false;
  size_t tls_bytes = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + p.p_vaddr;
    if (p.p_type == PT_LOAD && self >= start && self < start + p.p_memsz) mine = true;
    if (p.p_type == PT_TLS) tls_bytes = p.p_memsz;
  }
  if (!mine) return 0;
  auto* module = static_cast<Module*>(out);
  module->path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
  module->tls_bytes = tls_bytes;
  return 1;
}

// `_ZZN4pmoe...E<name>`: a function-local static of a function in namespace pmoe, not pmoe::emu.
bool is_kernel_shared(std::string_view name) {
  return name.starts_with("_ZZN4pmoe") && !name.starts_with("_ZZN4pmoe3emu");
}

std::vector<SharedVariable> read_shared_variables(const Module& module) {
  std::vector<SharedVariable> found;
  const int fd = ::open(module.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return found;
  struct stat st {};
  void* map = ::fstat(fd, &st) == 0 && size_t(st.st_size) > sizeof(ElfW(Ehdr))
                  ? ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                  : MAP_FAILED;
  ::close(fd);
  if (map == MAP_FAILED) return found;
  const auto* base = static_cast<const std::byte*>(map);
  const size_t size = size_t(st.st_size);
  const auto* header = reinterpret_cast<const ElfW(Ehdr)*>(base);
  const bool sane = std::memcmp(header->e_ident, ELFMAG, SELFMAG) == 0 &&
                    header->e_shentsize == sizeof(ElfW(Shdr)) &&
                    header->e_shoff + size_t(header->e_shnum) * sizeof(ElfW(Shdr)) <= size;
  if (sane) {
    const auto* sections = reinterpret_cast<const ElfW(Shdr)*>(base + header->e_shoff);
    for (int s = 0; s < header->e_shnum; ++s) {
      const ElfW(Shdr)& symtab = sections[s];
      if (symtab.sh_type != SHT_SYMTAB || symtab.sh_link >= header->e_shnum) continue;
      const ElfW(Shdr)& strtab = sections[symtab.sh_link];
      if (symtab.sh_offset + symtab.sh_size > size || strtab.sh_offset + strtab.sh_size > size)
        continue;
      const auto* symbols = reinterpret_cast<const ElfW(Sym)*>(base + symtab.sh_offset);
      const char* names = reinterpret_cast<const char*>(base + strtab.sh_offset);
      for (size_t i = 0; i < symtab.sh_size / sizeof(ElfW(Sym)); ++i) {
        const ElfW(Sym)& sym = symbols[i];
        if (ELF64_ST_TYPE(sym.st_info) != STT_TLS || sym.st_size == 0 ||
            sym.st_name >= strtab.sh_size || sym.st_value + sym.st_size > module.tls_bytes)
          continue;
        if (is_kernel_shared(names + sym.st_name)) found.push_back({sym.st_value, sym.st_size});
      }
    }
  }
  ::munmap(map, size);
  return found;
}

// This thread's TLS block of the module holding this function.
int find_this_threads_block(dl_phdr_info* info, size_t, void* out) {
  const auto self = reinterpret_cast<uintptr_t>(&find_this_threads_block);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& p = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + p.p_vaddr;
    if (p.p_type == PT_LOAD && self >= start && self < start + p.p_memsz) {
      *static_cast<void**>(out) = info->dlpi_tls_data;
      return 1;
    }
  }
  return 0;
}

const std::vector<SharedVariable>& shared_variables() {
  static const std::vector<SharedVariable> variables = [] {
    Module module;
    dl_iterate_phdr(find_this_module, &module);
    return module.path.empty() || module.tls_bytes == 0 ? std::vector<SharedVariable>{}
                                                        : read_shared_variables(module);
  }();
  return variables;
}

}  // namespace

void fill_shared_memory_with_garbage() {
  const std::vector<SharedVariable>& variables = shared_variables();
  if (variables.empty()) return;
  thread_local std::byte* const block = [] {
    void* tls = nullptr;
    dl_iterate_phdr(find_this_threads_block, &tls);
    return static_cast<std::byte*>(tls);
  }();
  if (!block) return;
  for (const SharedVariable& v : variables) std::memset(block + v.offset, 0xcd, v.bytes);
}

}  // namespace pmoe::emu
