// `__shared__` on the emulated device starts every block with garbage in it, as on a GPU, where a
// block's shared memory holds whatever an earlier block of any kernel left there.
//
//   __shared__ T x;  =  static thread_local T x;   (device_api.hpp: one copy per host thread,
//                                                    and a block keeps its host thread)
//   block start:       every such variable of this host thread  <-  0xcd 0xcd 0xcd ...
//
// Without it a block would see what the previous block on its host thread left, which on every
// path the tests take is the right value (thread 0 writes the same flag each time), so a missing
// barrier before the other threads read thread 0's `__shared__` value would pass.
//
// The variables are found once, in the symbol table of the module that holds the emulator (the
// test executable, or the library that links pmoe): every function-local thread_local (`_ZZ`)
// of a function in namespace pmoe outside pmoe::emu, which is what `__shared__` declares there
// (no other pmoe function has a local thread_local). The symbol's value is its offset in the
// module's TLS block; this thread's block comes from dl_iterate_phdr. A stripped module, or a
// kernel outside namespace pmoe, keeps the old behaviour (no garbage).
#pragma once

namespace pmoe::emu {

// Fills this host thread's copy of every `__shared__` variable with 0xcd (grid.cpp, before each
// block).
void fill_shared_memory_with_garbage();

}  // namespace pmoe::emu
