# cmake --install: header, libraries, CMake package (kvmem::kvmem,
# kvmem::kvmem_static) and kvmem.pc.
include(CMakePackageConfigHelpers)
install(FILES ${PROJECT_SOURCE_DIR}/include/kvmem.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kvmem kvmem_static EXPORT kvmemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT kvmemTargets NAMESPACE kvmem:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvmem)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvmemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvmemConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvmem)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvmemConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvmemConfig.cmake ${PROJECT_BINARY_DIR}/kvmemConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvmem)
# kvmem.pc finds its prefix relative to itself, so `cmake --install --prefix X`
# gives a working file wherever X is.
file(RELATIVE_PATH KVMEM_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
string(REGEX REPLACE "/$" "" KVMEM_PC_TO_PREFIX "${KVMEM_PC_TO_PREFIX}")  # no "..//lib"
# kvmem-static.pc names libkvmem.a itself (cgo's `#cgo pkg-config` cannot ask
# for --static, and -lkvmem would pick the shared library).
foreach(pc kvmem kvmem-static)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pc/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pc/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  # the build tree's own: PKG_CONFIG_PATH=<build dir> before any install
  set(KVMEM_PC_BUILD_LIBDIR $<TARGET_FILE_DIR:kvmem>)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}-uninstalled.pc.in ${PROJECT_BINARY_DIR}/${pc}-uninstalled.pc.gen @ONLY)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/${pc}-uninstalled.pc INPUT ${PROJECT_BINARY_DIR}/${pc}-uninstalled.pc.gen)
endforeach()
if(TARGET kvmem_cli)
  install(TARGETS kvmem_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
