# loongforge_add_layer(<layer> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...] [TORCH])
#   One shared library per layer: target loongforge_<layer>, alias loongforge::<layer>,
#   BUILD/INSTALL include interfaces. TORCH marks a layer whose TUs include LibTorch headers:
#   it gets the shared precompiled header and, when LOONGFORGE_UNITY_BUILD is on, a unity build.
function(loongforge_add_layer layer)
  cmake_parse_arguments(A "TORCH" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(t loongforge_${layer})
  add_library(${t} SHARED ${A_SOURCES})
  add_library(loongforge::${layer} ALIAS ${t})
  target_include_directories(${t} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_link_libraries(${t} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  set_target_properties(${t} PROPERTIES OUTPUT_NAME loongforge_${layer} EXPORT_NAME ${layer})
  target_compile_options(${t} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(A_TORCH)
    loongforge_torch_tu(${t})
  endif()
  install(TARGETS ${t} EXPORT LoongForgeTargets LIBRARY DESTINATION lib)
endfunction()

# LibTorch-facing target: links the CPU LibTorch and precompiles cmake/torch_pch.h. (One PCH per
# target: REUSE_FROM cannot mix -fPIC libraries and -fPIE executables.)
function(loongforge_torch_tu target)
  target_link_libraries(${target} PRIVATE loongforge::torch_cpu)
  # A LibTorch PCH costs about as much as two TUs to build, so it pays only for targets with
  # three or more C++ sources (measured: single-TU test binaries built slower with it).
  get_target_property(srcs ${target} SOURCES)
  list(FILTER srcs INCLUDE REGEX "\\.cpp$")
  list(LENGTH srcs n_cpp)
  if(LOONGFORGE_PCH AND n_cpp GREATER_EQUAL 3)
    target_precompile_headers(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
  endif()
  if(LOONGFORGE_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

# loongforge_add_test(<name> SOURCES ... DEPS ... [TORCH] [LABELS ...])
#   A GoogleTest binary in build/bin, its cases discovered at test time (so a build never runs
#   LibTorch programs). Multi-process cases use tests/support/multiprocess.h.
function(loongforge_add_test name)
  # RUN_SERIAL: the test runs alone (timing measurements that other tests' load would skew).
  cmake_parse_arguments(A "TORCH;RUN_SERIAL" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} loongforge_test_support GTest::gtest)
  target_compile_options(${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(A_TORCH)
    loongforge_torch_tu(${name})
    target_link_libraries(${name} PRIVATE loongforge_test_support_torch)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(props TIMEOUT ${A_TIMEOUT}
    ENVIRONMENT "LOONGFORGE_SOURCE_DIR=${PROJECT_SOURCE_DIR};LOONGFORGE_BINARY_DIR=${PROJECT_BINARY_DIR}")
  if(A_LABELS)
    list(APPEND props LABELS "${A_LABELS}")
  endif()
  if(A_RUN_SERIAL)
    list(APPEND props RUN_SERIAL TRUE)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
endfunction()
