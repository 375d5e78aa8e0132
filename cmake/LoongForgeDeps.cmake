# Third-party dependencies. Debian packages for the small libraries; LibTorch from the torch
# wheel in the project's virtual environment (tools/install-deps), found through
# torch.utils.cmake_prefix_path (tools/build passes it as CMAKE_PREFIX_PATH).
find_package(Threads REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(GTest REQUIRED)
include(GoogleTest)

# The wheel is a CUDA build: its CMake config wants the CUDA toolkit. An explicit arch list keeps
# it from probing for a GPU on machines that have none.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
endif()
find_program(LOONGFORGE_NVCC nvcc HINTS /usr/local/cuda/bin)
if(LOONGFORGE_NVCC AND NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER ${LOONGFORGE_NVCC})
endif()
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${Torch_VERSION}: ${TORCH_INSTALL_PREFIX}")

# loongforge::torch_cpu: what every CPU-side layer links. Deliberately not `torch`, which would
# pull libtorch_cuda.so (and the CUDA runtime) into every process; the CUDA backend module links
# that itself.
add_library(loongforge_torch_cpu INTERFACE)
target_link_libraries(loongforge_torch_cpu INTERFACE torch_cpu c10)
target_include_directories(loongforge_torch_cpu SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_compile_definitions(loongforge_torch_cpu INTERFACE USE_C10D_GLOO)
# at::parallel_for is a header template: its OpenMP body exists only where the including code is
# compiled with OpenMP (ATen/ParallelOpenMP.h tests _OPENMP). Without -fopenmp every own kernel that
# calls it (attention, fused norms/activations, the optimizer) runs on one thread while MKL and
# ATen's kernels use the whole team. So C++ that includes ATen compiles with -fopenmp, and links the
# wheel's libgomp (the one libtorch_cpu uses, by soname libgomp.so.1), not the compiler's: one
# OpenMP runtime, one thread team, one OMP_NUM_THREADS (docs/backends.md, "Threads").
set(LOONGFORGE_TORCH_GOMP ${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1)
if(NOT EXISTS ${LOONGFORGE_TORCH_GOMP})
  message(FATAL_ERROR "${LOONGFORGE_TORCH_GOMP} is missing: LibTorch is expected to come from the "
    "torch wheel with its OpenMP runtime (tools/install-deps installs it)")
endif()
add_library(loongforge_torch_gomp SHARED IMPORTED)
set_target_properties(loongforge_torch_gomp PROPERTIES IMPORTED_LOCATION ${LOONGFORGE_TORCH_GOMP}
  IMPORTED_SONAME libgomp.so.1)
target_compile_options(loongforge_torch_cpu INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp>)
target_link_libraries(loongforge_torch_cpu INTERFACE loongforge_torch_gomp)
add_library(loongforge::torch_cpu ALIAS loongforge_torch_cpu)

if(LOONGFORGE_CUDA STREQUAL "AUTO")
  if(LOONGFORGE_NVCC)
    set(LOONGFORGE_CUDA ON)
  else()
    set(LOONGFORGE_CUDA OFF)
  endif()
endif()
if(LOONGFORGE_CUDA)
  enable_language(CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${LOONGFORGE_CUDA_ARCHS})
  # CMake 3.25 does not know that nvcc 13 accepts C++20; the .cu files need only C++17.
  set(CMAKE_CUDA_STANDARD 17)
  message(STATUS "LoongForge CUDA backend: ON (sm_${LOONGFORGE_CUDA_ARCHS})")
else()
  message(STATUS "LoongForge CUDA backend: OFF")
endif()

# The wheel ships c10d's ProcessGroupGloo.hpp but not the gloo headers it includes. The header
# only names gloo types behind smart pointers plus one abstract store interface, so the shim in
# cmake/gloo-shim declares exactly those names; the class layout is unaffected
# (docs/distributed.md, "Gloo from the wheel").
set(LOONGFORGE_GLOO_SHIM_DIR ${PROJECT_SOURCE_DIR}/cmake/gloo-shim)

# Arrow/Parquet C++ (LeRobot datasets: data/meta parquet files). Debian 12 packages no libarrow,
# so the libraries and headers come, like LibTorch, from a wheel in the project's virtual
# environment: pyarrow ships its C++ libraries (manylinux_2_28, the C++11 ABI LibTorch also uses)
# under versioned sonames only, so they are linked by full path and found at run time through
# the RPATH CMake records for imported libraries (no symlinks to create).
if(NOT LOONGFORGE_PYARROW_PYTHON)
  if(Python3_EXECUTABLE)
    set(LOONGFORGE_PYARROW_PYTHON ${Python3_EXECUTABLE})
  else()
    set(LOONGFORGE_PYARROW_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  endif()
endif()
execute_process(
  COMMAND ${LOONGFORGE_PYARROW_PYTHON} -c
    "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0]); print(pyarrow.__version__)"
  OUTPUT_VARIABLE _lf_pyarrow OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _lf_pyarrow_rc ERROR_QUIET)
if(NOT _lf_pyarrow_rc EQUAL 0)
  message(FATAL_ERROR "pyarrow (Arrow/Parquet C++) not found with ${LOONGFORGE_PYARROW_PYTHON}; "
    "run tools/install-deps, or pass -DLOONGFORGE_PYARROW_PYTHON=<a python with pyarrow>")
endif()
string(REPLACE "\n" ";" _lf_pyarrow "${_lf_pyarrow}")
list(GET _lf_pyarrow 0 LOONGFORGE_ARROW_INCLUDE_DIR)
list(GET _lf_pyarrow 1 LOONGFORGE_ARROW_LIB_DIR)
list(GET _lf_pyarrow 2 LOONGFORGE_ARROW_VERSION)
file(STRINGS ${LOONGFORGE_ARROW_INCLUDE_DIR}/arrow/util/config.h _lf_arrow_so REGEX "define ARROW_SO_VERSION ")
string(REGEX REPLACE ".*\"([0-9]+)\".*" "\\1" LOONGFORGE_ARROW_SO_VERSION "${_lf_arrow_so}")
foreach(_lib arrow parquet)
  set(_path ${LOONGFORGE_ARROW_LIB_DIR}/lib${_lib}.so.${LOONGFORGE_ARROW_SO_VERSION})
  if(NOT EXISTS ${_path})
    message(FATAL_ERROR "pyarrow ${LOONGFORGE_ARROW_VERSION}: ${_path} is missing")
  endif()
  add_library(loongforge_${_lib} SHARED IMPORTED)
  set_target_properties(loongforge_${_lib} PROPERTIES IMPORTED_LOCATION ${_path}
    IMPORTED_SONAME lib${_lib}.so.${LOONGFORGE_ARROW_SO_VERSION})
  target_include_directories(loongforge_${_lib} SYSTEM INTERFACE ${LOONGFORGE_ARROW_INCLUDE_DIR})
endforeach()
target_link_libraries(loongforge_parquet INTERFACE loongforge_arrow)
add_library(loongforge::parquet ALIAS loongforge_parquet)
message(STATUS "Arrow/Parquet ${LOONGFORGE_ARROW_VERSION} (pyarrow): ${LOONGFORGE_ARROW_LIB_DIR}")
