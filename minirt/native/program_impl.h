/* Native programs: replay a run of recorded kernel calls (declared in kernels.h; recorded by
 * minirt/native/program.py).  Included once by kernels.c, after every entry point: a call goes
 * through the public entry point, so it takes the ISA selected at the time it runs, exactly as the
 * same call made from Python would.
 *
 * Each case passes the recorded arguments in the entry point's declaration order; the member read
 * (P pointer, I int, L long, F float) is the one the recorder filled from that parameter's C type. */

#define P(j) (a[j].p)
#define I(j) (a[j].i)
#define L(j) (a[j].l)
#define F(j) (a[j].f)

static int program_call(const mrt_call *call) {
    const mrt_arg *a = call->args;
    switch (call->entry) {
    case MRT_CALL_CONV2D_F32:
        return mrt_conv2d_f32(P(0), I(1), I(2), I(3), I(4), P(5), I(6), I(7), I(8), I(9), I(10), I(11), I(12), I(13),
                              I(14), I(15), I(16), I(17), P(18), P(19), P(20), I(21), F(22), F(23), I(24));
    case MRT_CALL_CONV2D_PACKED_F32:
        return mrt_conv2d_packed_f32(P(0), I(1), I(2), I(3), I(4), P(5), P(6), I(7), I(8), I(9), I(10), I(11), I(12),
                                     I(13), I(14), I(15), I(16), I(17), I(18), P(19), P(20), P(21), I(22), F(23),
                                     F(24), I(25));
    case MRT_CALL_DWCONV2D_F32:
        mrt_dwconv2d_f32(P(0), P(1), P(2), P(3), P(4), I(5), I(6), I(7), I(8), I(9), I(10), I(11), I(12), I(13), I(14),
                         I(15), I(16), I(17), I(18), I(19), F(20), F(21), I(22));
        return 0;
    case MRT_CALL_MAXPOOL2D_F32:
        mrt_maxpool2d_f32(P(0), P(1), I(2), I(3), I(4), I(5), I(6), I(7), I(8), I(9), I(10), I(11), I(12), I(13),
                          I(14), I(15));
        return 0;
    case MRT_CALL_MAXPOOL2D_S1_F32:
        return mrt_maxpool2d_s1_f32(P(0), P(1), L(2), I(3), I(4), I(5), I(6), I(7), I(8), I(9), I(10), I(11));
    case MRT_CALL_SGEMM_PB_F32:
        mrt_sgemm_pb_f32(I(0), I(1), I(2), P(3), L(4), P(5), P(6), L(7), P(8), I(9), P(10), L(11), I(12), F(13),
                         F(14), I(15));
        return 0;
    case MRT_CALL_SGEMM_BATCH_F32:
        mrt_sgemm_batch_f32(I(0), I(1), I(2), I(3), P(4), L(5), L(6), P(7), L(8), L(9), I(10), P(11), L(12), L(13),
                            P(14), I(15), P(16), L(17), L(18), I(19), F(20), F(21), I(22));
        return 0;
    case MRT_CALL_QCONV2D_F32:
        return mrt_qconv2d_f32(P(0), I(1), I(2), I(3), I(4), F(5), I(6), P(7), I(8), I(9), I(10), I(11), I(12), I(13),
                               I(14), I(15), I(16), I(17), I(18), I(19), P(20), P(21), P(22), P(23), I(24), F(25),
                               F(26), I(27));
    case MRT_CALL_QCONV2D_Q:
        return mrt_qconv2d_q(P(0), I(1), I(2), I(3), I(4), I(5), F(6), I(7), P(8), I(9), I(10), I(11), I(12), I(13),
                             I(14), I(15), I(16), I(17), I(18), I(19), I(20), P(21), P(22), P(23), P(24), P(25), P(26),
                             P(27), I(28), F(29), F(30), F(31), F(32), I(33));
    case MRT_CALL_QCONV2D_POOL_F32:
        return mrt_qconv2d_pool_f32(P(0), I(1), I(2), I(3), I(4), I(5), F(6), I(7), P(8), I(9), I(10), I(11), I(12),
                                    I(13), I(14), I(15), I(16), I(17), I(18), I(19), I(20), P(21), P(22), P(23), I(24),
                                    I(25), I(26), I(27), P(28), I(29), F(30), F(31), I(32));
    case MRT_CALL_QMATMUL_F32:
        return mrt_qmatmul_f32(P(0), L(1), I(2), F(3), I(4), P(5), I(6), P(7), P(8), P(9), I(10), F(11), F(12), I(13));
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
    default:
        return -100;
    }
}

#undef P
#undef I
#undef L
#undef F

long mrt_program_run(const mrt_call *calls, long n, int *rc) {
    for (long i = 0; i < n; i++) {
        int r = program_call(&calls[i]);
        if (r != 0) {
            *rc = r;
            return i;
        }
    }
    *rc = 0;
    return -1;
}
