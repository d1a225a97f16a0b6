/* Native programs: replay a run of recorded kernel calls (declared in kernels.h; recorded by
 * minirt/native/program.py).  Included once by kernels.c, after every entry point: a call goes
 * through the public entry point, so it takes the ISA selected at the time it runs, exactly as the
 * same call made from Python would.
 *
 * Each case passes the recorded arguments in the entry point's declaration order; the member read
 * (P pointer, I int, L long, F float) is the one the recorder filled from that parameter's C type.
 * The pointers are the prepared call's parameter structs (mrt_conv_geometry, mrt_epilogue, ...:
 * kept alive by the recording) and its data; what a call may hold: kernels.h, "native programs". */

#define P(j) (a[j].p)
#define I(j) (a[j].i)
#define L(j) (a[j].l)
#define F(j) (a[j].f)

static int program_call(const mrt_call *call) {
    const mrt_arg *a = call->args;
    switch (call->entry) {
    case MRT_CALL_CONV2D_F32:
        return mrt_conv2d_f32(P(0), P(1), P(2), P(3), P(4), P(5), P(6), I(7));
    case MRT_CALL_DWCONV2D_F32:
        mrt_dwconv2d_f32(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
        return 0;
    case MRT_CALL_MAXPOOL2D_F32:
        mrt_maxpool2d_f32(P(0), P(1), P(2), I(3));
        return 0;
    case MRT_CALL_MAXPOOL2D_S1_F32:
        return mrt_maxpool2d_s1_f32(P(0), P(1), P(2), I(3));
    case MRT_CALL_SGEMM_PB_F32:
        mrt_sgemm_pb_f32(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
        return 0;
    case MRT_CALL_SGEMM_F32:
        mrt_sgemm_f32(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
        return 0;
    case MRT_CALL_QCONV2D:
        return mrt_qconv2d(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
    case MRT_CALL_QDWCONV2D:
        mrt_qdwconv2d(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
        return 0;
    case MRT_CALL_QCONV2D_POOL_F32:
        return mrt_qconv2d_pool_f32(P(0), P(1), P(2), P(3), P(4), P(5), P(6), I(7));
    case MRT_CALL_QMATMUL_F32:
        return mrt_qmatmul_f32(P(0), P(1), P(2), P(3), P(4), I(5));
    case MRT_CALL_PLANE_MEANS_F32:
        mrt_plane_means_f32(P(0), P(1), L(2), L(3), I(4));
        return 0;
    case MRT_CALL_COPY_ROWS_F32:
        mrt_copy_rows_f32(P(0), L(1), P(2), L(3), L(4), L(5), I(6));
        return 0;
    case MRT_CALL_BINARY_F32:
        mrt_binary_f32(I(0), P(1), P(2), P(3), L(4), I(5));
        return 0;
    case MRT_CALL_UPSAMPLE_NEAREST_F32:
        mrt_upsample_nearest_f32(P(0), P(1), L(2), I(3), I(4), I(5), I(6), I(7));
        return 0;
    case MRT_CALL_RNN_F32:
        return mrt_rnn_f32(P(0), P(1), P(2), P(3), P(4), P(5), P(6), I(7));
    case MRT_CALL_BINARY_ROWS_F32:
        mrt_binary_rows_f32(I(0), P(1), P(2), P(3), L(4), L(5), L(6), I(7));
        return 0;
    case MRT_CALL_ACTIVATION_F32:
        mrt_activation_f32(P(0), P(1), P(2), L(3), I(4));
        return 0;
    case MRT_CALL_INDEX_COPY:
        return mrt_index_copy(P(0), P(1), P(2), I(3));
    case MRT_CALL_GATHER_ROWS:
        return mrt_gather_rows(P(0), P(1), P(2), P(3), I(4));
    case MRT_CALL_LOOKUP_ROWS:
        return mrt_lookup_rows(P(0), P(1), P(2), I(3), P(4), I(5));
    case MRT_CALL_SOFTMAX_F32:
        mrt_softmax_f32(P(0), P(1), L(2), L(3), I(4), I(5));
        return 0;
    case MRT_CALL_LAYERNORM_F32:
        mrt_layernorm_f32(P(0), P(1), P(2), P(3), L(4), L(5), F(6), I(7));
        return 0;
    case MRT_CALL_INSTANCENORM_F32:
        mrt_instancenorm_f32(P(0), P(1), P(2), P(3), L(4), L(5), F(6), I(7));
        return 0;
    case MRT_CALL_AVGPOOL2D_F32:
        mrt_avgpool2d_f32(P(0), P(1), F(2), P(3), P(4), I(5));
        return 0;
    case MRT_CALL_CONVTRANSPOSE_TILES_F32:
        return mrt_convtranspose_tiles_f32(P(0), P(1), P(2), P(3), P(4), I(5));
    case MRT_CALL_CAST:
        return mrt_cast(I(0), I(1), P(2), P(3), L(4), I(5));
    case MRT_CALL_BROADCAST:
        return mrt_broadcast(P(0), P(1), P(2), P(3), P(4), I(5));
    case MRT_CALL_REDUCE_F32:
        return mrt_reduce_f32(I(0), P(1), P(2), L(3), L(4), L(5), I(6));
    /* an int8 conv's input scaled per channel and / or added to an upsampled map, quantized */
    case MRT_CALL_QUANTIZE_U8_F32:
        mrt_quantize_u8_f32(P(0), P(1), L(2), F(3), I(4), I(5));
        return 0;
    case MRT_CALL_QCONVTRANSPOSE_TILES:
        return mrt_qconvtranspose_tiles(P(0), P(1), P(2), P(3), P(4), I(5));
    case MRT_CALL_SDPA_F32:
        return mrt_sdpa_f32(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
    case MRT_CALL_QUANTIZE_ADD_UP_U8_F32:
        return mrt_quantize_add_up_u8_f32(P(0), P(1), P(2), P(3), P(4), P(5), P(6), I(7));
    /* a decoder's step (minirt.genai): sequence lengths from the mask, RMS norms, 4-bit products, attention */
    case MRT_CALL_REDUCE_INT:
        return mrt_reduce_int(I(0), I(1), P(2), P(3), L(4), L(5), L(6), I(7));
    case MRT_CALL_GQA_DECODE_F32:
        return mrt_gqa_decode_f32(P(0), P(1), P(2), P(3), P(4), P(5), I(6));
    case MRT_CALL_QNBITS_MATMUL:
        return mrt_qnbits_matmul(P(0), P(1), I(2), P(3), P(4), I(5));
    case MRT_CALL_RMSNORM_F32:
        mrt_rmsnorm_f32(P(0), P(1), P(2), L(3), L(4), F(5), I(6));
        return 0;
    /* a tree ensemble: the votes, then the outputs (trees_impl.h) */
    case MRT_CALL_TREE_VOTES:
        return mrt_tree_votes(P(0), P(1), L(2), L(3), P(4), P(5), I(6));
    case MRT_CALL_TREE_FINISH:
        return mrt_tree_finish(P(0), P(1), P(2), P(3), P(4), L(5), I(6));
    default:
        return -100;
    }
}

#undef P
#undef I
#undef L
#undef F

/* The calls in order (see mrt_program_run); with ns, each call's elapsed nanoseconds added to ns[i].  Inlined
 * into both entry points, so mrt_program_run's loop has no timing in it. */
static inline long program_loop(const mrt_call *calls, long n, int *rc, double *ns) {
    const mrt_cancel *cancel = tls_cancel;
    for (long i = 0; i < n; i++) {
        if (cancel && mrt_cancelled(cancel)) {
            *rc = MRT_CANCELLED;
            return i;
        }
        struct timespec t0, t1;
        if (ns) clock_gettime(CLOCK_MONOTONIC, &t0);
        int r = program_call(&calls[i]);
        if (ns) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            ns[i] += (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
        }
        if (r != 0) {
            *rc = r;
            return i;
        }
    }
    *rc = 0;
    return -1;
}

long mrt_program_run(const mrt_call *calls, long n, int *rc) { return program_loop(calls, n, rc, NULL); }

long mrt_program_run_timed(const mrt_call *calls, long n, int *rc, double *ns) { return program_loop(calls, n, rc, ns); }
