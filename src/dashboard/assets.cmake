# The dashboard's assets (dashboard/ui/) embedded in the binary.
#
# Included from src/CMakeLists.txt after nshpc_dashboard is declared, this file adds a build step;
# run as a script (cmake -P, the build step's command) it is that step. The live views' libraries
# (dashboard/vendor, npm) are embedded with the page when they are installed (see below). At build time each asset
# is gzipped (`gzip -9n`: no name, no time stamp, so the bytes depend only on the content) and a
# generated source holds them all, raw and gzipped, with a table {path, mime, etag, offsets,
# sizes} (see assets.hpp).
#
# Why `.incbin`: the assembler copies the bytes as they are, so the generated unit compiles in
# a few milliseconds whatever the assets weigh; a hex array (as keysyms.cpp does for its names)
# makes the compiler parse five characters per byte, and CMake's regex over hex is slow beyond a
# few hundred KB. The unit's text carries every asset's SHA-256, so ccache (which cannot see an
# .incbin'd file) sees a new unit whenever an asset changes; OBJECT_DEPENDS makes Ninja rebuild it.
#
# Raw bytes are embedded too (for a client that does not accept gzip): a few tens of KB for the
# page, about 1 MB with the live views' libraries, which is cheaper than a decompressor on the
# serving path.

if(CMAKE_SCRIPT_MODE_FILE)
  # ---- The build step: -DUI_DIR=<dashboard/ui> -DOUT_DIR=<where to write> ----
  file(GLOB_RECURSE files RELATIVE ${UI_DIR} ${UI_DIR}/*)
  list(SORT files)
  list(REMOVE_ITEM files index.html)
  if(NOT EXISTS ${UI_DIR}/index.html)
    message(FATAL_ERROR "dashboard/ui/index.html is missing: the dashboard's page must be there")
  endif()
  file(MAKE_DIRECTORY ${OUT_DIR}/gz ${OUT_DIR}/vendor)
  foreach(f ${files})
    set(source_of_${f} ${UI_DIR}/${f})
  endforeach()

  # The live views' libraries, from dashboard/vendor/node_modules (scripts/ui-vendor.sh, npm ci of
  # the pinned lock), as they are under ui/<bundle>/vendor/: noVNC's ES modules keep their layout
  # (core/ imports ../vendor/pako/), xterm.js is its ESM build. Each with its licence. Without them
  # (a build without npm) vendor/live.json says so and the page says the live views are not built in.
  set(modules ${VENDOR_DIR}/node_modules)
  set(desktop false)
  set(terminal false)
  macro(vendor_file asset source)
    list(APPEND files ${asset})
    set(source_of_${asset} ${source})
  endmacro()
  if(EXISTS ${modules}/@novnc/novnc/core/rfb.js)
    set(desktop true)
    file(GLOB_RECURSE novnc RELATIVE ${modules}/@novnc/novnc ${modules}/@novnc/novnc/core/*.js
         ${modules}/@novnc/novnc/vendor/pako/lib/*.js)
    list(SORT novnc)
    foreach(f ${novnc})
      vendor_file(vendor/novnc/${f} ${modules}/@novnc/novnc/${f})
    endforeach()
    vendor_file(vendor/novnc/LICENSE.txt ${modules}/@novnc/novnc/LICENSE.txt)
    vendor_file(vendor/novnc/vendor/pako/LICENSE.txt ${modules}/@novnc/novnc/vendor/pako/LICENSE)
  endif()
  if(EXISTS ${modules}/@xterm/xterm/lib/xterm.mjs AND EXISTS ${modules}/@xterm/addon-fit/lib/addon-fit.mjs)
    set(terminal true)
    vendor_file(vendor/xterm/xterm.mjs ${modules}/@xterm/xterm/lib/xterm.mjs)
    vendor_file(vendor/xterm/xterm.css ${modules}/@xterm/xterm/css/xterm.css)
    vendor_file(vendor/xterm/LICENSE.txt ${modules}/@xterm/xterm/LICENSE)
    vendor_file(vendor/xterm/addon-fit.mjs ${modules}/@xterm/addon-fit/lib/addon-fit.mjs)
    vendor_file(vendor/xterm/addon-fit.LICENSE.txt ${modules}/@xterm/addon-fit/LICENSE)
  endif()
  file(WRITE ${OUT_DIR}/vendor/live.json "{\"desktop\": ${desktop}, \"terminal\": ${terminal}}\n")
  vendor_file(vendor/live.json ${OUT_DIR}/vendor/live.json)

  function(mime_of path out)
    string(REGEX MATCH "[^.]+$" ext "${path}")
    if(ext STREQUAL "html")
      set(m "text/html; charset=utf-8")
    elseif(ext STREQUAL "js")
      set(m "text/javascript; charset=utf-8")
    elseif(ext STREQUAL "css")
      set(m "text/css; charset=utf-8")
    elseif(ext STREQUAL "svg")
      set(m "image/svg+xml; charset=utf-8")
    elseif(ext STREQUAL "png")
      set(m "image/png")
    elseif(ext STREQUAL "mjs")
      set(m "text/javascript; charset=utf-8")
    elseif(ext STREQUAL "txt")
      set(m "text/plain; charset=utf-8")
    elseif(ext STREQUAL "json")
      set(m "application/json; charset=utf-8")
    else()
      message(FATAL_ERROR "dashboard/ui/${path}: no content type is known for .${ext}; add it to mime_of in "
                          "src/dashboard/assets.cmake")
    endif()
    set(${out} "${m}" PARENT_SCOPE)
  endfunction()

  # The bundle hash names this build's assets (/ui/<bundle>/...): it covers every asset but
  # index.html, which names the bundle and is served without a long cache.
  set(manifest "")
  foreach(f ${files})
    file(SHA256 ${source_of_${f}} h)
    string(APPEND manifest "${f} ${h}\n")
  endforeach()
  string(SHA256 bundle "${manifest}")
  string(SUBSTRING ${bundle} 0 16 bundle)
  file(READ ${UI_DIR}/index.html index)
  string(REPLACE "{{BUNDLE}}" ${bundle} index "${index}")
  file(WRITE ${OUT_DIR}/index.html "${index}")

  set(asm "")
  set(table "")
  set(offset 0)
  set(count 0)
  foreach(f index.html ${files})
    if(f STREQUAL "index.html")
      set(src ${OUT_DIR}/index.html)
    else()
      set(src ${source_of_${f}})
    endif()
    string(MAKE_C_IDENTIFIER ${f} id)
    set(gz ${OUT_DIR}/gz/${id}.gz)
    execute_process(COMMAND gzip -9n -c ${src} OUTPUT_FILE ${gz} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "gzip -9n ${src} failed (${rc}); the dashboard's assets need the gzip tool")
    endif()
    file(SHA256 ${src} h)
    file(SIZE ${src} raw_size)
    file(SIZE ${gz} gz_size)
    mime_of(${f} mime)
    math(EXPR raw_offset "${offset} + ${gz_size}")
    string(APPEND asm "  \".incbin \\\"${gz}\\\"\\n\"\n  \".incbin \\\"${src}\\\"\\n\"\n")
    string(APPEND table "  {\"${f}\", \"${mime}\", \"${h}\", ${offset}, ${gz_size}, ${raw_offset}, ${raw_size}},\n")
    math(EXPR offset "${raw_offset} + ${raw_size}")
    math(EXPR count "${count} + 1")
  endforeach()

  file(WRITE ${OUT_DIR}/dashboard_assets.cpp
"// Generated from dashboard/ui/ by src/dashboard/assets.cmake; do not edit.
#include \"dashboard/assets.hpp\"

// Every asset gzipped, then raw, one after the other (offsets in the table below).
__asm__(
  \".section .rodata.nshpc_ui,\\\"a\\\",@progbits\\n\"
  \".global nshpc_ui_blob\\n\"
  \".hidden nshpc_ui_blob\\n\"
  \"nshpc_ui_blob:\\n\"
${asm}  \".global nshpc_ui_blob_end\\n\"
  \".hidden nshpc_ui_blob_end\\n\"
  \"nshpc_ui_blob_end:\\n\"
  \".previous\\n\");

namespace nshpc::dashboard::detail {
const char kBundle[] = \"${bundle}\";
const AssetEntry kAssetEntries[] = {
${table}};
const std::size_t kAssetEntryCount = ${count};
const std::size_t kAssetBlobSize = ${offset};
}  // namespace nshpc::dashboard::detail
")
  return()
endif()

# ---- Included from src/CMakeLists.txt: the build step and the sources ----
set(NSHPC_UI_DIR ${PROJECT_SOURCE_DIR}/dashboard/ui)
set(NSHPC_UI_VENDOR ${PROJECT_SOURCE_DIR}/dashboard/vendor)
# The vendored libraries count too: npm ci (make deps-ui) after configuring changes this glob,
# which CONFIGURE_DEPENDS notices at the next build.
file(GLOB_RECURSE NSHPC_UI_FILES CONFIGURE_DEPENDS ${NSHPC_UI_DIR}/*
     ${NSHPC_UI_VENDOR}/node_modules/@novnc/novnc/core/*.js ${NSHPC_UI_VENDOR}/node_modules/@novnc/novnc/vendor/pako/lib/*.js
     ${NSHPC_UI_VENDOR}/node_modules/@xterm/xterm/lib/xterm.mjs ${NSHPC_UI_VENDOR}/node_modules/@xterm/xterm/css/xterm.css
     ${NSHPC_UI_VENDOR}/node_modules/@xterm/addon-fit/lib/addon-fit.mjs)
set(NSHPC_UI_OUT ${CMAKE_BINARY_DIR}/generated/dashboard)
add_custom_command(
  OUTPUT ${NSHPC_UI_OUT}/dashboard_assets.cpp
  COMMAND ${CMAKE_COMMAND} -DUI_DIR=${NSHPC_UI_DIR} -DVENDOR_DIR=${NSHPC_UI_VENDOR} -DOUT_DIR=${NSHPC_UI_OUT}
          -P ${CMAKE_CURRENT_LIST_DIR}/assets.cmake
  DEPENDS ${NSHPC_UI_FILES} ${CMAKE_CURRENT_LIST_DIR}/assets.cmake
  COMMENT "Embedding the dashboard's assets (dashboard/ui, gzip -9n)"
  VERBATIM)
set_source_files_properties(${NSHPC_UI_OUT}/dashboard_assets.cpp PROPERTIES
  SKIP_PRECOMPILE_HEADERS ON
  OBJECT_DEPENDS "${NSHPC_UI_FILES}")
target_sources(nshpc_dashboard PRIVATE ${CMAKE_CURRENT_LIST_DIR}/assets.cpp ${CMAKE_CURRENT_LIST_DIR}/ui_routes.cpp
  ${NSHPC_UI_OUT}/dashboard_assets.cpp)
