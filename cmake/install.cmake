# Install rules and the package config, so that another CMake project can say
#
#   find_package(pmoe REQUIRED)
#   target_link_libraries(app PRIVATE pmoe::pmoe)
#
# pmoe::pmoe carries everything a user needs, MpiCommunicator included: its headers
# (<pmoe/pmoe.hpp>, <pmoe/mpi_communicator.hpp>) and MPI::MPI_CXX, Threads::Threads as usage
# requirements. pmoe is a static library, so its private dependencies (BLAS, Boost.Context for the
# emulated CUDA device, the CUDA runtime for the GPU backend) are found again by pmoeConfig.cmake.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS pmoe EXPORT pmoeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/pmoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET pmoe-bench)
  install(TARGETS pmoe-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(PMOE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pmoe)
install(EXPORT pmoeTargets NAMESPACE pmoe:: DESTINATION ${PMOE_CMAKE_DIR})
configure_package_config_file(cmake/pmoeConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/pmoeConfig.cmake
                              INSTALL_DESTINATION ${PMOE_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pmoeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pmoeConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/pmoeConfigVersion.cmake
        DESTINATION ${PMOE_CMAKE_DIR})
