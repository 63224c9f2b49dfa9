# `make check-backends`, in the sim build (included by tests/CMakeLists.txt,
# whose flags and precompiled header its two tests take): the hip and cuda backends compiled
# and linked beside the build's own, no GPU needed. Only
# src/device/backend_gpu.cpp (and the cuda kernel) differ between backends:
# every other file compiles the same for sim, hip and cuda. So each backend
# is that one file (a one-file archive), and what the check links against it
# reuses this build's libraries as they are: the installable library
# (libkvstrand_check_BACKEND.so, from the public API's sources), the
# device-runtime probe (every backend call, statically) and the public-API
# test (through that library, so none of its symbols is left undefined).
#
# The backend's archive goes in whole, first on each link line: it defines
# every backend symbol before the linker reads kvstrand_device, whose sim
# backend (two files outside the unity batches, CMakeLists.txt) is then
# never taken. A symbol the backend lacks is left undefined, and one the sim
# files would add clashes with it: either fails the link.
if(NOT KVSTRAND_GPU STREQUAL "sim")
  message(FATAL_ERROR "KVSTRAND_CHECK_BACKENDS checks hip and cuda beside a sim build (got KVSTRAND_GPU=${KVSTRAND_GPU})")
endif()
if(NOT EXISTS "${KVSTRAND_CUDA_ROOT}/include/cuda_runtime_api.h")
  message(FATAL_ERROR "KVSTRAND_CHECK_BACKENDS needs the CUDA toolkit; none at KVSTRAND_CUDA_ROOT=${KVSTRAND_CUDA_ROOT}")
endif()
find_library(AMDHIP64 amdhip64)
if(NOT AMDHIP64)
  message(FATAL_ERROR "KVSTRAND_CHECK_BACKENDS needs libamdhip64 (scripts/bootstrap.sh --hip installs it)")
endif()
kvstrand_enable_cuda()

set(backend_gpu ${PROJECT_SOURCE_DIR}/src/device/backend_gpu.cpp)
add_library(kvstrand_backend_hip STATIC EXCLUDE_FROM_ALL ${backend_gpu})
target_compile_definitions(kvstrand_backend_hip PRIVATE KVSTRAND_GPU_HIP)
target_link_libraries(kvstrand_backend_hip PRIVATE kvstrand_device)
set(runtime_hip ${AMDHIP64})

add_library(kvstrand_backend_cuda STATIC EXCLUDE_FROM_ALL ${backend_gpu} $<TARGET_OBJECTS:kvstrand_segment_copy_kernel>)
target_compile_definitions(kvstrand_backend_cuda PRIVATE KVSTRAND_GPU_CUDA)
target_compile_options(kvstrand_backend_cuda PRIVATE -isystem ${KVSTRAND_CUDA_ROOT}/include)
target_link_libraries(kvstrand_backend_cuda PRIVATE kvstrand_device)
set(runtime_cuda ${KVSTRAND_CUDA_ROOT}/lib64/libcudart_static.a ${CMAKE_DL_LIBS} rt)

# Compiled as this build's tests are (tests/CMakeLists.txt), so that they
# reuse its precompiled header.
function(kvstrand_backend_check_test name)
  if(kvstrand_tests_o1)
    target_compile_options(${name} PRIVATE -O1)
  endif()
  if(KVSTRAND_PCH)
    target_link_libraries(${name} PRIVATE kvstrand_common)
    target_precompile_headers(${name} REUSE_FROM kvstrand-test-pch)
  endif()
  target_include_directories(${name} PRIVATE ${kvstrand_test_support})
endfunction()

set(kvstrand_backend_checks)
foreach(backend hip cuda)
  set(first "LINKER:--whole-archive" "$<TARGET_FILE:kvstrand_backend_${backend}>" "LINKER:--no-whole-archive")
  set(runtime ${runtime_${backend}})

  set(lib kvstrand_check_${backend})
  add_library(${lib} SHARED EXCLUDE_FROM_ALL ${kvstrand_api_sources})
  target_include_directories(${lib} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_link_libraries(${lib} PRIVATE kvstrand_connector ${runtime})
  # One --whole-archive for both archives: CMake drops a repeated option.
  target_link_options(${lib} PRIVATE "LINKER:--whole-archive" "$<TARGET_FILE:kvstrand_backend_${backend}>"
                      "$<TARGET_FILE:kvstrand_kv>" "LINKER:--no-whole-archive"
                      "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/kvstrand.map" "LINKER:--no-undefined")
  add_dependencies(${lib} kvstrand_backend_${backend})
  set_property(TARGET ${lib} APPEND PROPERTY LINK_DEPENDS $<TARGET_FILE:kvstrand_backend_${backend}>)
  if(KVSTRAND_PCH)
    target_precompile_headers(${lib} REUSE_FROM kvstrand-pch)
  endif()

  set(probe test_device_runtime_${backend})
  add_executable(${probe} EXCLUDE_FROM_ALL device/test_device_runtime.cpp)
  target_link_libraries(${probe} PRIVATE kvstrand_test_main kvstrand_device ${runtime})
  target_link_options(${probe} PRIVATE ${first})
  kvstrand_backend_check_test(${probe})
  add_dependencies(${probe} kvstrand_backend_${backend})
  set_property(TARGET ${probe} APPEND PROPERTY LINK_DEPENDS $<TARGET_FILE:kvstrand_backend_${backend}>)

  set(api test_public_api_${backend})
  add_executable(${api} EXCLUDE_FROM_ALL api/test_public_api.cpp)
  target_link_libraries(${api} PRIVATE kvstrand_test_main ${lib})
  kvstrand_backend_check_test(${api})

  list(APPEND kvstrand_backend_checks ${lib} ${probe} ${api})
endforeach()
add_custom_target(kvstrand-backend-checks DEPENDS ${kvstrand_backend_checks})
