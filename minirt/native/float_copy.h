/* One copy of the float kernels, for the ISA that MRT_SUFFIX (the functions' suffix) and MRT_TARGET (their
 * target attribute) name, with MRT_VL float lanes: kernels.c includes this once per copy (_base, _avx2,
 * _neon32; the AVX-512 copy takes only some of these headers) and mrt_select_isa picks one at run time.
 * The three macros and the headers' MRT_CHUNK are undefined at the end, ready for the next copy. */
#include "kernels_impl.h"
#include "layout_impl.h"
#include "gemm_impl.h"
#include "rowops_impl.h"
#include "sdpa_impl.h"
#include "rnn_impl.h"
#include "dwconv_impl.h"
#include "winograd_impl.h"
#include "roialign_impl.h"
#undef MRT_VL
#undef MRT_SUFFIX
#undef MRT_TARGET
#undef MRT_CHUNK
