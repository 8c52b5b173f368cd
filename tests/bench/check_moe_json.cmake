# Checks the JSON of pmoe-bench moe --device cuda (bench.moe_cuda.columns in tests/CMakeLists.txt):
# every row has the phase times its layer runs, its device memory, its expert GEMMs' rate and rows
# issued / rows in use and, for EP, its traffic, all above 0 (on a device they were 0 before the
# layers timed their phases and counted their bytes, and stay 0 without MoeConfig::device_stats),
# and names the kernels its expert GEMMs took.
#   cmake -DJSON=<file written by --json> -P check_moe_json.cmake
file(READ "${JSON}" text)
string(JSON rows GET "${text}" rows)
string(JSON count LENGTH "${rows}")
if(count EQUAL 0)
  message(FATAL_ERROR "${JSON}: no rows")
endif()
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON variant GET "${rows}" ${i} variant)
  set(fields max_mem_mb route_ms experts_ms combine_ms gemm_tflops gemm_rows_issued_per_used)
  if(variant STREQUAL "tp")
    list(APPEND fields reduce_ms)
  elseif(variant STREQUAL "ep")
    list(APPEND fields dispatch_ms mb_moved_per_rank)
  endif()
  foreach(field ${fields})
    string(JSON value GET "${rows}" ${i} ${field})
    if(NOT value GREATER 0)
      message(FATAL_ERROR "${JSON}: row ${i} (${variant}): ${field} = ${value}, expected > 0")
    endif()
  endforeach()
  # Which kernels the expert GEMMs took, as the layer reported it ("-" where it said nothing).
  string(JSON gemm GET "${rows}" ${i} expert_gemm)
  if(gemm STREQUAL "" OR gemm STREQUAL "-")
    message(FATAL_ERROR "${JSON}: row ${i} (${variant}): expert_gemm not reported")
  endif()
endforeach()
message(STATUS "${count} rows: phase times, device memory, GEMM rate and rows, EP traffic > 0, "
               "expert GEMM path named")
