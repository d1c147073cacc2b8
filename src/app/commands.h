/* The subcommand handlers of the mgtrain executable, each `int f(argc, argv)` with argv[0]
   the command's name, returning the process exit status. */
#ifndef MGT_APP_COMMANDS_H
#define MGT_APP_COMMANDS_H

#include <stdio.h>

#include "mgt/device.h"

int mgt_app_cmd_devices(int argc, char **argv);
int mgt_app_cmd_train(int argc, char **argv);
int mgt_app_cmd_bench(int argc, char **argv);
/* data pipeline (cmd_data.c): `import-idx` (Fashion-MNIST -> PNG tree), `check-data` (decode
   every file, list the bad ones), `bench-data` (loader images/s per decode thread) */
int mgt_app_cmd_import_idx(int argc, char **argv);
int mgt_app_cmd_check_data(int argc, char **argv);
int mgt_app_cmd_bench_data(int argc, char **argv);
/* `pack` (cmd_pack.c): an ImageFolder tree into one pack file */
int mgt_app_cmd_pack(int argc, char **argv);
int mgt_app_cmd_model(int argc, char **argv);

/* `model --bytes` (cmd_model.c): one training step of cfg (batch images; zero the gradients,
   forward, loss, backward, fp16's non-finite count, SGD with momentum) on a byte-model device
   (mgt_devset_open_bytes) storing activations as `act` says, and its tally. */
#define MGT_APP_BYTES_MAX_ROWS 64
typedef struct mgt_app_bytes_trace {
    mgt_bytes_row rows[MGT_APP_BYTES_MAX_ROWS];
    int n;
    int values, values_16; /* activations, and those stored in 16 bits */
} mgt_app_bytes_trace;
struct mgt_model_config;
mgt_status mgt_app_trace_step(const struct mgt_model_config *cfg, int batch, mgt_precision act,
                              mgt_app_bytes_trace *t);
int mgt_app_cmd_plot(int argc, char **argv);
int mgt_app_cmd_export(int argc, char **argv);
int mgt_app_cmd_predict(int argc, char **argv);

/* Exit statuses, the same in every command: 0 done; 1 a run that cannot be done or failed
   (missing or corrupt data or checkpoint, no GPU for --device cuda, a device error, a NaN
   loss, a timeout); 2 a bad command line (unknown flag, bad value, unknown --arch, bad
   --mock value, contradictory flags); 128 + N a run stopped by signal N (Ctrl-C: 130), its
   checkpoint saved. */
enum { MGT_APP_EXIT_OK = 0, MGT_APP_EXIT_FAILED = 1, MGT_APP_EXIT_USAGE = 2 };

/* The exit status for devices that could not be opened: a value the flags gave that is
   wrong (--gpus, --mock, MGT_MOCK: MGT_ERR_INVALID) is a bad command line, anything else
   (no GPU, a device that fails) a run that cannot be done. */
int mgt_app_device_exit(mgt_status st);

/* A flag's whole-number or real value within [lo, hi]; on failure prints
   "mgtrain: FLAG 'VALUE': expected ..." to stderr and returns false. */
bool mgt_app_flag_int(const char *flag, const char *v, long lo, long hi, long *out);
bool mgt_app_flag_float(const char *flag, const char *v, double lo, double hi, double *out);
/* The one line for an option getopt refused (c ':' a flag without its value, else an unknown
   one): "mgtrain CMD: FLAG needs a value (mgtrain CMD --help)"; returns 2, the usage status. */
int mgt_app_bad_option(const char *cmd, int c, char **argv);
/* --amp bf16|fp16 (f32_name: also "f32" for plain fp32, as --grad-dtype takes) */
bool mgt_app_flag_precision(const char *flag, const char *v, bool allow_fp16, mgt_precision *out);
/* "on" (1) or "off" (0) */
bool mgt_app_flag_onoff(const char *flag, const char *v, int *out);

/* Every architecture by family, one family a line ("  resnet: resnet18 resnet34 ..."), and
   how many there are. */
void mgt_app_print_archs(FILE *f);
int mgt_app_arch_count(void);
/* Each family's defaults, one a line: input side, training augmentation, validation
   transform (for `train --help`). */
void mgt_app_print_family_defaults(FILE *f);

/* Parses a --gpus list such as "0,1,2,3" or "0,0" into ids; at most MGT_MAX_DEVICES. */
mgt_status mgt_app_parse_gpus(const char *s, int *ids, int *n);
/* Parses --device auto|cuda|cpu. */
mgt_status mgt_app_parse_device_kind(const char *s, mgt_device_kind *kind);
/* --no-p2p, --tf32 and --deterministic, which every command that opens devices takes: their
   getopt codes (above any command's own), the entries for its long-option table, the lines
   for its usage text, and the handler that sets the switch code c names (false: not one). */
enum { MGT_APP_OPT_NO_P2P = 0x1000, MGT_APP_OPT_TF32, MGT_APP_OPT_DETERMINISTIC };
#define MGT_APP_SWITCH_LONGOPTS                                       \
    {"no-p2p", no_argument, NULL, MGT_APP_OPT_NO_P2P},                \
        {"tf32", no_argument, NULL, MGT_APP_OPT_TF32},                \
    {                                                                 \
        "deterministic", no_argument, NULL, MGT_APP_OPT_DETERMINISTIC \
    }
#define MGT_APP_SWITCH_USAGE                                                               \
    "  --no-p2p               stage every peer copy through pinned host memory\n"          \
    "  --tf32                 CUDA: cuBLAS and cuDNN may use TF32 (default: exact FP32)\n" \
    "  --deterministic        CUDA: only deterministic cuDNN algorithms\n"
bool mgt_app_device_switch(int c, mgt_devset_options *sw);

/* The devices a command's flags name: --device, --gpus, --mock and the switches, as given
   (a zeroed struct: --device auto and nothing else), then what mgt_app_resolve_devices made
   of them. */
typedef struct mgt_app_devices {
    mgt_device_kind kind;  /* --device; resolved: CUDA or MOCK */
    const char *gpus;      /* --gpus LIST, or NULL: every CUDA device, else a mock per core */
    const char *mock;      /* --mock SPEC, or NULL: MGT_MOCK or the defaults */
    mgt_devset_options sw; /* --no-p2p, --tf32, --deterministic (its mock field unused) */
    bool resolved;
    int ids[MGT_MAX_DEVICES]; /* resolved: the device ids, n of them */
    int n;
    mgt_mock_options mock_opts; /* resolved (mock devices): --mock, else MGT_MOCK, parsed */
    bool nchw_picked; /* resolved: NCHW for want of AVX-512F (mgt_mock_options_pick_layout) */
} mgt_app_devices;

/* Whether MGT_REQUIRE_CUDA asks that CUDA be used wherever a run would fall back to mock
   devices or a test would skip its CUDA part (tools/gpu-check.sh sets it): then a CUDA that
   cannot be opened is a failure with the runtime's reason. */
bool mgt_app_cuda_required(void);
/* Resolves the flags once (later calls do nothing): AUTO becomes CUDA or MOCK, with the
   one-line notice when it falls back to mock devices (a failure under MGT_REQUIRE_CUDA=1,
   and for --device cuda, with the CUDA runtime's reason); --gpus is parsed and checked against
   the machine (empty: every CUDA device, or one mock device per core, at most 8); --mock is
   parsed and checked against the ids. Errors name the flag ("--mock: 'mem=abc': ..."). */
mgt_status mgt_app_resolve_devices(mgt_app_devices *d);
/* Resolves (if not yet) and opens the first `count` of the devices (0: all of them); the mock
   options apply to those of them that the spec names (bench opens prefixes of one list). */
mgt_status mgt_app_open_devices(mgt_app_devices *d, int count, mgt_devset **out);

#endif
