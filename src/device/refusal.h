/* Why a backend's 16-bit convolution kernel did not run an op, and what follows from each
   reason: shared by the backends, so that CUDA (cuDNN's statuses) and the mock devices (their
   lowp fault hook) decide alike, and the mock can test every branch. Plain C, also included
   by the CUDA backend's C++. */
#ifndef MGT_DEVICE_REFUSAL_H
#define MGT_DEVICE_REFUSAL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgt_lp_refusal {
    MGT_LP_REFUSAL_NONE,      /* the 16-bit kernel ran */
    MGT_LP_REFUSAL_NO_KERNEL, /* no 16-bit kernel for this shape, type, layout or architecture */
    MGT_LP_REFUSAL_BAD_PARAM, /* the library rejects the 16-bit configuration's parameters
                                 (grouped or odd-channel NHWC shapes) */
    MGT_LP_REFUSAL_NO_MEMORY, /* its workspace or the library's own memory is short right now */
    MGT_LP_REFUSAL_BROKEN,    /* the installation: a version mismatch, a missing sublibrary,
                                 an incompatible driver or runtime */
    MGT_LP_REFUSAL_FAULT,     /* the device failed, or the call itself was wrong (a null or
                                 misaligned pointer): the fp32 path would not do better */
    MGT_LP_REFUSAL_COUNT
} mgt_lp_refusal;

typedef enum mgt_lp_action {
    MGT_LP_FP32_REMEMBER, /* the rounded-fp32 path now and for every later call of the shape */
    MGT_LP_FP32_ONCE,     /* the rounded-fp32 path for this call; the next call tries again */
    MGT_LP_FAIL,          /* the op fails, naming the reason */
} mgt_lp_action;

/* The decision for each reason (MGT_LP_REFUSAL_NONE: never asked). */
mgt_lp_action mgt_lp_refusal_action(mgt_lp_refusal why);
/* "no_kernel", "bad_param", "no_memory", "broken", "fault" (the mock's fault=lowp names). */
const char *mgt_lp_refusal_name(mgt_lp_refusal why);
/* MGT_LP_REFUSAL_COUNT for a name that is none of the above. */
mgt_lp_refusal mgt_lp_refusal_from_name(const char *name, unsigned long len);

#ifdef __cplusplus
}
#endif

#endif
