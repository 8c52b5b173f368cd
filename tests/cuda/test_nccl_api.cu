// One process, no GPU needed: NCCL's host functions loaded at run time (src/cuda/transport/
// nccl_api.hpp) from the libnccl already in the process, the release checked against the
// headers, and the errors when PMOE_NCCL_LIBRARY names a missing file, a library that is not
// NCCL, or the other NCCL flavour's library (the toolkit's 2.28, the wheel's 2.30). The host API
// alone (nccl_host_api, pmoe-bench's NCCL all-to-all-v row) takes that other flavour's library,
// which the GIN path refuses: on the first H200 lease the row was refused NCCL 2.28.9 for a
// check that only the GIN kernels need.
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

std::string host_load_error() {
  try {
    nccl_host_api();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Each in a fresh process (threadsafe death tests re-run the binary; suites named *DeathTest run
// first), as a process loads NCCL once.
TEST(NcclHostApiDeathTest, NamesWhatItCannotLoad) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("PMOE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
        const std::string missing = host_load_error();
        setenv("PMOE_NCCL_LIBRARY", "libz.so.1", 1);  // loads, but is not NCCL
        const std::string not_nccl = host_load_error();
        std::fprintf(stderr, "missing: %s\nnot NCCL: %s\n", missing.c_str(), not_nccl.c_str());
        const bool named =
            missing.find("NCCL host API: cannot load NCCL (/nonexistent/libnccl.so.2)") !=
                std::string::npos &&
            missing.find("set PMOE_NCCL_LIBRARY") != std::string::npos &&
            not_nccl.find("libz.so.1 has no ncclGetVersion") != std::string::npos;
        std::exit(named ? 0 : 1);
      },
      testing::ExitedWithCode(0), "missing: NCCL host API");
}

#ifdef PMOE_TEST_OTHER_NCCL_LIBRARY
// The other flavour's libnccl (the toolkit's 2.28.9 under the wheel's 2.30 headers: the H200
// lease's case) serves the host API, and the GIN path still refuses it.
TEST(NcclHostApiDeathTest, TakesAnotherMinorReleaseThatTheGinPathRefuses) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("PMOE_NCCL_LIBRARY", PMOE_TEST_OTHER_NCCL_LIBRARY, 1);
        const NcclHostApi& host = nccl_host_api();
        const std::string gin = load_error();
        int version = 0;
        PMOE_NCCL_HOST_CHECK(host.GetVersion(&version));
        std::fprintf(stderr, "host API: %s, release %d; GIN path: %s\n", host.path.c_str(),
                     host.version, gin.c_str());
        const bool ok = host.path == PMOE_TEST_OTHER_NCCL_LIBRARY && version == host.version &&
                        host.version / 10000 == NCCL_MAJOR &&
                        host.version / 100 != NCCL_MAJOR * 100 + NCCL_MINOR &&
                        gin.find("device API headers") != std::string::npos &&
                        &nccl_host_api() == &host;
        std::exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "host API: ");
}
#endif

TEST(NcclHostApi, OnlyTheMajorReleaseMustAgree) {
  EXPECT_EQ(nccl_host_release_mismatch(23007, 22809), "") << "2.28.9 under 2.30.7's headers";
  EXPECT_EQ(nccl_host_release_mismatch(22809, 23007), "");
  EXPECT_EQ(nccl_host_release_mismatch(23007, 21903), "");
  const std::string other = nccl_host_release_mismatch(23007, 30001);
  EXPECT_NE(other.find("built with NCCL 2's headers, but this libnccl is 3.0.1"), std::string::npos)
      << other;
  EXPECT_NE(nccl_host_release_mismatch(23007, 0), "") << "no working ncclGetVersion";
}

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
  EXPECT_EQ(&nccl_host_api(), &api) << "the host API shares the GIN path's library once loaded";
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
