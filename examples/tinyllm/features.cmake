# The kvmem methods tinyllm compiles in: those whose API the header declares
# (TINYLLM_HAVE_RETRIEVE, _EVICT, _ATTEND, _PERSIST, _SEGMENTS). Shared by the
# native build and the WebAssembly module (wasm/CMakeLists.txt).
function(tinyllm_features header out_var)
  file(READ ${header} _tl_header)
  set(_features "")
  foreach(pair "RETRIEVE:kvmem_retrieve(" "EVICT:kvmem_select_keep(" "ATTEND:kvmem_attend("
               "PERSIST:kvmem_agent_save(" "SEGMENTS:kvmem_segments_create(")
    string(REPLACE ":" ";" _p "${pair}")
    list(GET _p 0 _name)
    list(GET _p 1 _sym)
    string(FIND "${_tl_header}" "${_sym}" _at)
    if(NOT _at EQUAL -1)
      list(APPEND _features TINYLLM_HAVE_${_name})
    endif()
  endforeach()
  set(${out_var} ${_features} PARENT_SCOPE)
endfunction()
