# The CUDA architectures of a `pip install .` build, chosen as torch's C++ extensions choose them,
# so that a wheel built in a training environment targets what that environment runs on:
#
#   1. TORCH_CUDA_ARCH_LIST from the environment: "8.0;9.0a", "8.0 9.0+PTX", "Hopper";
#      X.Y is sm_XY code, a suffix a/f the arch-specific or family variant (9.0a: sm_90a),
#      +PTX adds the PTX of that entry for GPUs newer than the list;
#   2. else the compute capabilities of the GPUs nvidia-smi sees (sm_90 becomes sm_90a, which
#      pmoe's Hopper code is built for), each with its PTX;
#   3. else nothing, and CMakeLists.txt's default (sm_80, sm_90a, PTX for compute_90) applies.
#
# A CMAKE_CUDA_ARCHITECTURES given on the command line (-C cmake.define.CMAKE_CUDA_ARCHITECTURES=)
# wins over all three; CMakeLists.txt does not call this then.
function(pmoe_cuda_arch_for_pip out)
  set(archs "")
  set(from "")
  set(list "$ENV{TORCH_CUDA_ARCH_LIST}")
  if(NOT list STREQUAL "")
    set(from "TORCH_CUDA_ARCH_LIST=${list}")
    string(REPLACE " " ";" list "${list}")
    # torch's names for the families pmoe can run on.
    set(named_Ampere "8.0;8.6+PTX")
    set(named_Ada "8.9+PTX")
    set(named_Hopper "9.0+PTX")
    set(named_Blackwell "10.0;12.0+PTX")
    foreach(entry IN LISTS list)
      if(entry STREQUAL "")
        continue()
      endif()
      if(DEFINED named_${entry})
        list(APPEND list_expanded ${named_${entry}})
      else()
        list(APPEND list_expanded ${entry})
      endif()
    endforeach()
    foreach(entry IN LISTS list_expanded)
      if(NOT entry MATCHES "^([0-9]+)\\.([0-9]+)([af]?)(\\+PTX)?$")
        message(FATAL_ERROR "TORCH_CUDA_ARCH_LIST: cannot read '${entry}' (want e.g. 8.0, 9.0a, "
                            "9.0+PTX, Hopper)")
      endif()
      set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
      list(APPEND archs "${arch}-real")
      if(CMAKE_MATCH_4)
        list(APPEND archs "${arch}-virtual")
      endif()
    endforeach()
  else()
    find_program(PMOE_NVIDIA_SMI nvidia-smi)
    if(PMOE_NVIDIA_SMI)
      execute_process(COMMAND ${PMOE_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE caps OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                      RESULT_VARIABLE rc TIMEOUT 30)
      if(rc EQUAL 0 AND caps MATCHES "^[0-9]")
        string(REPLACE "\n" ";" caps "${caps}")
        foreach(cap IN LISTS caps)
          string(STRIP "${cap}" cap)
          string(REPLACE "." "" arch "${cap}")
          if(arch STREQUAL "90")
            set(arch 90a)
          endif()
          list(APPEND archs "${arch}-real" "${arch}-virtual")
        endforeach()
        set(from "the visible GPU (nvidia-smi: compute capability ${caps})")
      endif()
    endif()
  endif()
  list(REMOVE_DUPLICATES archs)
  if(archs)
    message(STATUS "pmoe: CUDA architectures from ${from}")
    set(${out} "${archs}" PARENT_SCOPE)
  else()
    message(STATUS "pmoe: CUDA architectures: neither TORCH_CUDA_ARCH_LIST nor a visible GPU, "
                   "the default")
  endif()
endfunction()
