// A main() for the fuzz targets where libFuzzer is not linked in (GCC builds, `make test`): it
// runs every file of the given corpus directories, then inputs made by a fixed pseudo-random
// generator (fresh bytes, and seeds with bytes flipped, cut or appended) until the time given by
// -max_total_time=SECONDS (default 5) has passed. A bug aborts, as under libFuzzer. It finds less
// than libFuzzer (no coverage feedback), but keeps every target building and running in CI.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  double seconds = 5;
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-max_total_time=", 0) == 0) {
      seconds = std::atof(arg.c_str() + 16);
      continue;
    }
    if (arg[0] == '-') continue;  // other libFuzzer flags mean nothing here
    for (const auto& entry : std::filesystem::directory_iterator(arg)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream file(entry.path(), std::ios::binary);
      seeds.emplace_back(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
    }
  }
  const auto start = std::chrono::steady_clock::now();
  for (const auto& seed : seeds) LLVMFuzzerTestOneInput(seed.data(), seed.size());
  std::mt19937_64 random(0x9e3779b97f4a7c15ull);
  long runs = long(seeds.size());
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    std::vector<uint8_t> input;
    if (!seeds.empty() && random() % 4 != 0) {
      input = seeds[random() % seeds.size()];
      const int edits = 1 + int(random() % 4);
      for (int e = 0; e < edits; ++e) {
        const uint64_t what = random() % 3;
        if (what == 0 && !input.empty()) input[random() % input.size()] = uint8_t(random());
        if (what == 1 && !input.empty()) input.resize(random() % input.size());
        if (what == 2) input.push_back(uint8_t(random()));
      }
    } else {
      input.resize(random() % 64);
      for (auto& b : input) b = uint8_t(random());
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
    ++runs;
  }
  std::printf("%s: %ld inputs (%zu from the corpus) in %.1f s, no bug found\n", argv[0], runs,
              seeds.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}
