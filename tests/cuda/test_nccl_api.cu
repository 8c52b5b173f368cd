// One process, no GPU needed: NCCL's host functions loaded at run time (src/cuda/transport/
// nccl_api.hpp) from the libnccl already in the process, the release checked against the
// headers, and the errors when PMOE_NCCL_LIBRARY names a missing file, a library that is not
// NCCL, or the other NCCL flavour's library (the toolkit's 2.28, the wheel's 2.30).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/transport/nccl_api.hpp"

namespace pmoe::cuda {
namespace {

std::string load_error() {
  try {
    nccl_api();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#ifdef PMOE_TEST_OTHER_NCCL_LIBRARY
// A libnccl of another release already in the process (torch's 2.30 beside a 2.28 build) is not
// taken: pmoe loads the one CMake found beside it. In a fresh process of its own (threadsafe
// death tests re-run the binary), as a process loads NCCL once.
TEST(NcclApiDeathTest, PassesOverALoadedNcclOfAnotherRelease) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!dlopen(PMOE_TEST_OTHER_NCCL_LIBRARY, RTLD_NOW | RTLD_GLOBAL)) std::exit(2);
        unsetenv("PMOE_NCCL_LIBRARY");
        const NcclApi& api = nccl_api();
        std::fprintf(stderr, "loaded %s\n", api.path.c_str());
        std::exit(api.path == PMOE_NCCL_LIBRARY_PATH ? 0 : 1);
      },
      testing::ExitedWithCode(0), "loaded");
}
#endif

// Order matters: a failed load is not remembered, a successful one is (once per process).
TEST(NcclApi, RefusesWhatIsNotNcclThenLoadsTheReleaseOfItsHeaders) {
  setenv("PMOE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  std::string error = load_error();
  EXPECT_NE(error.find("cannot load NCCL (/nonexistent/libnccl.so.2)"), std::string::npos) << error;
  EXPECT_NE(error.find("set PMOE_NCCL_LIBRARY"), std::string::npos) << error;

  setenv("PMOE_NCCL_LIBRARY", "libz.so.1", 1);  // loads, but is not NCCL
  error = load_error();
  EXPECT_NE(error.find("libz.so.1 has no ncclGetVersion"), std::string::npos) << error;

#ifdef PMOE_TEST_OTHER_NCCL_LIBRARY
  // The other flavour's libnccl (the toolkit's 2.28 where pmoe is built with the wheel's 2.30
  // headers, or the other way round): a release whose ncclDevComm the kernels cannot read.
  setenv("PMOE_NCCL_LIBRARY", PMOE_TEST_OTHER_NCCL_LIBRARY, 1);
  error = load_error();
  EXPECT_NE(error.find("pmoe's kernels were built with NCCL " + std::to_string(NCCL_MAJOR) + "." +
                       std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) +
                       "'s device API headers"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(NCCL_VERSION_CODE >= 22900 ? "is the older 2.28" : "but this is 2.30"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("PMOE_NCCL_LIBRARY"), std::string::npos) << error;
#endif

  // A libnccl the process already loaded (as torch loads its own) is the one taken.
  unsetenv("PMOE_NCCL_LIBRARY");
  ASSERT_NE(dlopen(PMOE_NCCL_LIBRARY_PATH, RTLD_NOW | RTLD_GLOBAL), nullptr) << dlerror();
  const NcclApi& api = nccl_api();
  EXPECT_EQ(api.path, "libnccl.so.2") << "a second copy from " << api.path;
  EXPECT_EQ(api.version / 100, NCCL_MAJOR * 100 + NCCL_MINOR) << api.path;
  EXPECT_STREQ(api.GetErrorString(ncclInvalidArgument),
               "invalid argument (run with NCCL_DEBUG=WARN for details)")
      << "NCCL's own text for a code";
  EXPECT_EQ(&nccl_api(), &api) << "loaded once";
}

TEST(NcclApi, CheckMacroNamesTheCallAndNcclsText) {
  const NcclApi& api = nccl_api();
  try {
    PMOE_NCCL_CHECK(api.GetVersion(nullptr));  // NCCL refuses a null output pointer
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("api.GetVersion(nullptr) failed at"), std::string::npos) << what;
    EXPECT_NE(what.find("test_nccl_api.cu:"), std::string::npos) << what;
    EXPECT_NE(what.find("invalid argument"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pmoe::cuda
