# Per-file ISA flags. Only files under cpp/moecore/kernels/x86/ get these; every other file is
# compiled for baseline x86-64 and the level is chosen at run time (isa/isa.h).
include(CheckCXXCompilerFlag)

set(MOECORE_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(MOECORE_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)
set(MOECORE_ISA_FLAGS_avx512bf16 ${MOECORE_ISA_FLAGS_avx512} -mavx512bf16 -mavx512vnni
    -mavx512vbmi)
set(MOECORE_ISA_FLAGS_amx ${MOECORE_ISA_FLAGS_avx512bf16} -mamx-tile -mamx-bf16 -mamx-int8)

# moecore_add_isa_sources(<target> <level> <files...>): adds the files with that level's flags and
# defines MOECORE_COMPILED_<LEVEL> on the target so the kernel tables name the row.
function(moecore_add_isa_sources target level)
  set(flags ${MOECORE_ISA_FLAGS_${level}})
  string(REPLACE ";" " " flag_string "${flags}")
  string(MAKE_C_IDENTIFIER "moecore_has_${level}" probe)
  set(CMAKE_REQUIRED_QUIET ON)
  check_cxx_compiler_flag("${flag_string}" ${probe})
  if(NOT ${probe})
    message(STATUS "moecore: compiler lacks ${level} flags; those kernels are not built")
    return()
  endif()
  target_sources(${target} PRIVATE ${ARGN})
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${flags}")
  string(TOUPPER ${level} upper)
  target_compile_definitions(${target} PRIVATE MOECORE_COMPILED_${upper}=1)
  message(STATUS "moecore: ${level} kernels: ${ARGN}")
endfunction()
