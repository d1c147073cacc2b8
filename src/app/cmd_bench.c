/* `mgtrain bench`: the training step on 1, 2, 4, ... of the listed devices in one process
   (images/s, scaling, a per-device breakdown), and `mgtrain bench allreduce`: the gradient
   all-reduce alone over message sizes, tree against ring, with algbw and busbw. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "app/commands.h"
#include "mgt/plot.h"
#include "mgt/comm.h"
#include "mgt/nn.h"
#include "mgt/thread.h"
#include "mgt/train.h"

/* 1, 2, 4, ... below n, then n */
static int device_counts(int n, int *counts)
{
    int k = 0;
    for (int c = 1; c < n; c *= 2)
        counts[k++] = c;
    counts[k++] = n;
    return k;
}

/* How a CUDA run keeps this model's activations between ops: planned on a byte-model device,
   which plans as the CUDA backend does (mgt_devset_open_bytes), so the line says what the GPU
   runs: under --amp the channels-last NHWC 16-bit path, and how many activations take it. */
static void print_cuda_storage(const mgt_train_config *c, cJSON *root)
{
    if (c->amp == MGT_PREC_F32) {
        printf("activations between ops: NCHW fp32\n");
        cJSON_AddStringToObject(root, "cuda_activations", "nchw fp32");
        return;
    }
    const mgt_arch_info *a = mgt_arch_find(c->arch);
    mgt_model_config mc = {.arch = c->arch,
                           .classes = c->dummy_classes ? c->dummy_classes
                                      : a              ? a->synthetic_classes
                                                       : 1000,
                           .in_channels = c->image_channels ? c->image_channels : 3,
                           .image_size = c->image_size ? c->image_size
                                         : a           ? a->synthetic_size
                                                       : 224,
                           .batch = 1,
                           .amp = c->amp};
    mgt_devset *set = NULL;
    mgt_model *m = NULL;
    mgt_model_counts n = {0};
    if (mgt_devset_open_bytes(MGT_LAYOUT_NHWC, c->amp, false, &set) == MGT_OK &&
        mgt_model_create(&mc, mgt_devset_device(set, 0), &m) == MGT_OK)
        mgt_model_get_counts(m, &n);
    mgt_model_free(m);
    mgt_devset_free(set);
    printf("activations between ops: NHWC %s where the ops around them take it (cuDNN's "
           "channels-last path), %d of %d; the rest NCHW fp32\n",
           mgt_precision_name(c->amp), n.values_16, n.values);
    cJSON_AddStringToObject(root, "cuda_activations", "nhwc 16-bit");
    cJSON_AddNumberToObject(root, "cuda_activations_16", n.values_16);
    cJSON_AddNumberToObject(root, "cuda_activations_all", n.values);
}

/* The first device's per-op profile of the timed steps: each op's ms per step, its share of
   the device's kernel time and GFLOP/s where it counts flops (--op-profile). */
static void print_op_profile(const mgt_device *d, long steps, cJSON *r)
{
    mgt_op_time t[128];
    int n = mgt_device_op_times(d, t, 128);
    if (n == 0) {
        printf("%7s per-op profile: %s keeps none\n", "", mgt_device_name(d));
        return;
    }
    double total = 0;
    for (int i = 0; i < n && i < 128; i++)
        total += t[i].seconds;
    printf("%7s per-op profile of %s over %ld steps (kernel time %.1f ms per step):\n", "",
           mgt_device_name(d), steps, 1e3 * total / (double)steps);
    printf("%7s %-28s %10s %7s %10s %9s\n", "", "op", "ms/step", "share", "calls/step", "GFLOP/s");
    cJSON *ops = cJSON_CreateArray();
    for (int i = 0; i < n && i < 128; i++) {
        printf("%7s %-28s %10.2f %6.1f%% %10.1f", "", t[i].name, 1e3 * t[i].seconds / (double)steps,
               100 * t[i].seconds / total, (double)t[i].calls / (double)steps);
        if (t[i].flops > 0)
            printf(" %9.1f", t[i].flops / t[i].seconds / 1e9);
        printf("\n");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "op", t[i].name);
        cJSON_AddNumberToObject(o, "seconds", t[i].seconds);
        cJSON_AddNumberToObject(o, "flops", t[i].flops);
        cJSON_AddNumberToObject(o, "calls", (double)t[i].calls);
        cJSON_AddItemToArray(ops, o);
    }
    cJSON_AddItemToObject(r, "op_profile", ops);
}

static void bench_usage(FILE *f)
{
    fprintf(
        f, "usage: mgtrain bench [--device auto|cuda|cpu] [--gpus LIST] [--mock SPEC] [-a ARCH]\n"
           "                     [-b PER_DEVICE_BATCH] [--dummy | --data DIR] [--steps S] "
           "[--warmup W]\n"
           "                     [--image-size S] [--in-channels C] [--classes K] [--allreduce "
           "tree|ring]\n"
           "                     [--bucket-mb M] [-j N] [--json FILE] [--plot FILE.svg]\n"
           "                     [--no-p2p] [--tf32] [--deterministic] [--amp bf16|fp16]\n"
           "                     [--grad-dtype f32|bf16] [--op-profile]\n"
           "       mgtrain bench allreduce [--device ...] [--gpus LIST] [--mock SPEC]\n"
           "                     [--algo tree|ring|both] [--min-bytes SIZE] [--max-bytes SIZE]\n"
           "                     [--node-exchange allgather|reduce-scatter|both]\n"
           "                     [--model-nodes 2,4,...] [--model-arch A] [--model-batch B]\n"
           "                     [--model-step FWD_MS,BWD_MS] [--json FILE] [--plot FILE.svg]\n"
           "                     [--no-p2p]\n"
           "Runs the training step on the first 1, 2, 4, ... of the listed devices (and on all),\n"
           "after W warm-up steps, and prints images/s, speedup and efficiency against one device\n"
           "at the same per-device batch, with each device's step broken down; --op-profile\n"
           "adds the first device's time per op (mock devices).\n"
           "Under mpirun, bench allreduce runs across the ranks (the same --gpus count on each)\n"
           "and compares the two exchanges across nodes (--node-exchange), next to the link\n"
           "model's prediction (--mock xlink=BW,LAT models the link between nodes) and a ring\n"
           "all-reduce's time. --model-nodes adds a table of the modelled all-reduce and step of\n"
           "--model-arch (resnet50) at those node counts, from one node's measured step\n"
           "(--model-batch images a device, 8) or --model-step.\n"
           "Under mpirun, bench runs each row on that many devices of every node (the same\n"
           "--gpus on each), -b per device of the whole world, and node 0 prints the world's\n"
           "images/s; speedup and efficiency are against one device of one node's rate.\n");
}

static int bench_allreduce(int argc, char **argv);

enum {
    B_DEVICE = 256,
    B_GPUS,
    B_MOCK,
    B_DUMMY,
    B_DATA,
    B_STEPS,
    B_WARMUP,
    B_SIZE,
    B_CHANNELS,
    B_CLASSES,
    B_ALLREDUCE,
    B_BUCKET,
    B_JSON,
    B_PLOT,
    B_ALGO,
    B_MIN,
    B_MAX,
    B_AMP,
    B_GRAD_DTYPE,
    B_NODE_EXCHANGE,
    B_MODEL_NODES,
    B_MODEL_ARCH,
    B_MODEL_BATCH,
    B_MODEL_STEP,
    B_OP_PROFILE,
};

int mgt_app_cmd_bench(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "allreduce") == 0)
        return bench_allreduce(argc - 1, argv + 1);
    static const struct option longopts[] = {
        {"device", required_argument, NULL, B_DEVICE},
        {"gpus", required_argument, NULL, B_GPUS},
        {"mock", required_argument, NULL, B_MOCK},
        {"arch", required_argument, NULL, 'a'},
        {"batch-size", required_argument, NULL, 'b'},
        {"dummy", no_argument, NULL, B_DUMMY},
        {"data", required_argument, NULL, B_DATA},
        {"steps", required_argument, NULL, B_STEPS},
        {"warmup", required_argument, NULL, B_WARMUP},
        {"image-size", required_argument, NULL, B_SIZE},
        {"in-channels", required_argument, NULL, B_CHANNELS},
        {"classes", required_argument, NULL, B_CLASSES},
        {"allreduce", required_argument, NULL, B_ALLREDUCE},
        {"bucket-mb", required_argument, NULL, B_BUCKET},
        {"workers", required_argument, NULL, 'j'},
        {"json", required_argument, NULL, B_JSON},
        {"plot", required_argument, NULL, B_PLOT},
        {"help", no_argument, NULL, 'h'},
        {"amp", required_argument, NULL, B_AMP},
        {"grad-dtype", required_argument, NULL, B_GRAD_DTYPE},
        {"op-profile", no_argument, NULL, B_OP_PROFILE},
        MGT_APP_SWITCH_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    mgt_devset_options sw = {0};
    mgt_train_config c;
    mgt_train_config_defaults(&c);
    c.arch = "resnet18"; /* the ImageNet example's, unless -a says */
    c.dummy = true;
    c.epochs = 1;
    c.lr.lr = 0.01f;
    c.print_freq = 1 << 30;
    /* the harness's switches: profile every device's step after 3 warm-up steps, no
       validation, output to nowhere */
    mgt_train_controls ctl = {.profile = true, .warmup_steps = 3, .no_validation = true};
    long per_dev = 32, steps = 20, v;
    double x;
    const char *gpus = NULL, *mock = NULL, *json = NULL, *plot = NULL;
    mgt_device_kind kind = MGT_DEVICE_AUTO;
    bool ok = true;
    int opt;
    optind = 1;
    opterr = 0;
    while (ok && (opt = getopt_long(argc, argv, ":a:b:j:h", longopts, NULL)) != -1) {
        switch (opt) {
        case B_DEVICE:
            ok = mgt_app_parse_device_kind(optarg, &kind) == MGT_OK;
            if (!ok)
                fprintf(stderr, "mgtrain bench: %s\n", mgt_error_last());
            break;
        case B_GPUS: gpus = optarg; break;
        case B_MOCK: mock = optarg; break;
        case 'a': c.arch = optarg; break;
        case 'b': ok = mgt_app_flag_int("-b", optarg, 1, 1 << 20, &per_dev); break;
        case B_DUMMY:
            c.dummy = true;
            c.data_dir = NULL;
            break;
        case B_DATA:
            c.dummy = false;
            c.data_dir = optarg;
            break;
        case B_STEPS: ok = mgt_app_flag_int("--steps", optarg, 1, 1 << 20, &steps); break;
        case B_WARMUP:
            ok = mgt_app_flag_int("--warmup", optarg, 0, 1 << 20, &v);
            ctl.warmup_steps = (int)v;
            break;
        case B_SIZE:
            ok = mgt_app_flag_int("--image-size", optarg, 8, 4096, &v);
            c.image_size = (int)v;
            break;
        case B_CHANNELS:
            ok = mgt_app_flag_int("--in-channels", optarg, 1, 3, &v);
            c.dummy_channels = (int)v;
            break;
        case B_CLASSES:
            ok = mgt_app_flag_int("--classes", optarg, 1, 1 << 20, &v);
            c.dummy_classes = (int)v;
            break;
        case B_ALLREDUCE:
            ok = mgt_allreduce_algo_parse(optarg, &c.allreduce) == MGT_OK;
            if (!ok)
                fprintf(stderr, "mgtrain bench: %s\n", mgt_error_last());
            break;
        case B_BUCKET:
            ok = mgt_app_flag_float("--bucket-mb", optarg, 0.001, 4096, &x);
            c.bucket_bytes = (size_t)(x * 1024 * 1024);
            break;
        case 'j':
            ok = mgt_app_flag_int("--workers", optarg, 0, 1024, &v);
            c.workers = (int)v;
            break;
        case B_JSON: json = optarg; break;
        case B_PLOT: plot = optarg; break;
        case B_AMP: ok = mgt_app_flag_precision("--amp", optarg, true, &c.amp); break;
        case B_GRAD_DTYPE:
            ok = mgt_app_flag_precision("--grad-dtype", optarg, false, &c.grad_dtype);
            break;
        case B_OP_PROFILE: ctl.op_profile = true; break;
        case 'h': bench_usage(stdout); return 0;
        default:
            if (opt != ':' && mgt_app_device_switch(opt, &sw))
                break;
            mgt_app_bad_option("bench", opt, argv);
            ok = false;
        }
    }
    if (!ok)
        return 2;
    if (optind < argc) {
        fprintf(stderr, "mgtrain bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    /* resolved once, so that every device count opens a prefix of one list */
    mgt_app_devices bd = {.kind = kind, .gpus = gpus, .mock = mock, .sw = sw};
    mgt_status rst = mgt_app_resolve_devices(&bd);
    if (rst != MGT_OK) {
        fprintf(stderr, "mgtrain bench: %s\n", mgt_error_last());
        return mgt_app_device_exit(rst);
    }
    if (!mgt_arch_find(c.arch)) {
        fprintf(stderr,
                "mgtrain bench: --arch '%s': unknown architecture (`mgtrain model` lists them)\n",
                c.arch);
        return 2;
    }
    /* A mock device is a fixed share of the machine, as a GPU is: every row gives each device
       the same compute threads (the cores over the largest count), or efficiency would
       measure the cores a lone device borrows rather than the scaling. */
    int mock_threads = 0;
    if (bd.kind == MGT_DEVICE_MOCK) {
        mock_threads = bd.mock_opts.threads_per_device;
        if (mock_threads == 0) {
            mock_threads = mgt_cpu_count() / bd.n > 1 ? mgt_cpu_count() / bd.n : 1;
            bd.mock_opts.threads_per_device = mock_threads;
        }
    }
    mgt_world *world;
    if (mgt_world_open(&world) != MGT_OK) {
        fprintf(stderr, "mgtrain bench: %s\n", mgt_error_last());
        return 1;
    }
    int nodes = mgt_world_size(world);
    mgt_world_set_link(world, bd.mock_opts.xlink_bytes_per_s, bd.mock_opts.xlink_latency_s);
    ctl.world = world;
    if (mgt_world_rank(world) != 0) { /* node 0 reports */
        json = plot = NULL;
        if (!freopen("/dev/null", "w", stdout))
            clearerr(stdout);
    }
    FILE *devnull = fopen("/dev/null", "w");
    ctl.out = devnull;
    c.dummy_steps = (int)(ctl.warmup_steps + steps);
    ctl.max_steps = ctl.warmup_steps + steps;
    int counts[16];
    int nc = device_counts(bd.n, counts);
    cJSON *root = cJSON_CreateObject(), *results = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "arch", c.arch);
    cJSON_AddNumberToObject(root, "per_device_batch", (double)per_dev);
    cJSON_AddNumberToObject(root, "nodes", nodes);
    cJSON_AddStringToObject(root, "device_kind", mgt_device_kind_name(bd.kind));
    cJSON_AddStringToObject(root, "allreduce", c.allreduce == MGT_ALLREDUCE_RING ? "ring" : "tree");
    cJSON_AddNumberToObject(root, "steps", (double)steps);
    cJSON_AddNumberToObject(root, "warmup", ctl.warmup_steps);
    if (mock_threads > 0)
        cJSON_AddNumberToObject(root, "mock_threads_per_device", mock_threads);
    cJSON_AddItemToObject(root, "results", results);
    double xs[16], ips[16], eff[16], base = 0;
    printf("mgtrain bench: %s, %ld images per device per step, %ld timed steps after %d "
           "warm-up, %s all-reduce, %s devices\n",
           c.arch, per_dev, steps, ctl.warmup_steps,
           c.allreduce == MGT_ALLREDUCE_RING ? "ring" : "tree", mgt_device_kind_name(bd.kind));
    if (mock_threads > 0)
        printf("mock devices: %d compute thread%s each in every row (--mock threads=N to "
               "choose)\n",
               mock_threads, mock_threads == 1 ? "" : "s");
    if (bd.kind == MGT_DEVICE_MOCK) {
        bool nchw = bd.mock_opts.conv_im2col || bd.mock_opts.layout_nchw;
        printf("activations between ops: %s\n",
               bd.nchw_picked ? "NCHW (this CPU has no AVX-512F, which mgtrain's nChw16c kernels "
                                "want: --mock layout=blocked for them)"
               : nchw         ? "NCHW"
                              : "oneDNN's nChw16c where the ops around them take it (--mock "
                                "layout=nchw for NCHW)");
        cJSON_AddStringToObject(root, "mock_layout", nchw ? "nchw" : "blocked");
    }
    if (bd.kind == MGT_DEVICE_CUDA)
        print_cuda_storage(&c, root);
    if (nodes > 1)
        printf("world: %d nodes (mpirun); a row's devices are per node, its images/s the "
               "world's\n",
               nodes);
    printf("%7s %10s %8s %10s %9s | %-9s %8s %8s %8s %8s %8s\n", "devices", "images/s", "speedup",
           "efficiency", "step ms", "device", "data", "forward", "backward", "reduce*", "optim");
    int rc = 0;
    for (int k = 0; k < nc; k++) {
        int n = counts[k];
        mgt_devset *set;
        mgt_status ost = mgt_app_open_devices(&bd, n, &set);
        if (ost != MGT_OK) {
            fprintf(stderr, "mgtrain bench: %s\n", mgt_error_last());
            rc = mgt_app_device_exit(ost);
            break;
        }
        c.batch_size = (int)per_dev * n * nodes;
        mgt_train_result res;
        mgt_status st = mgt_train_run(&c, &ctl, set, &res);
        if (st != MGT_OK) {
            fprintf(stderr, "mgtrain bench: %d devices%s: %s\n", n, nodes > 1 ? " per node" : "",
                    mgt_error_last());
            mgt_devset_free(set);
            rc = 1;
            break;
        }
        /* every node runs the same steps in lockstep: the world's rate is nodes times this
           node's (node 0 measures its own devices' images) */
        double world_ips = res.timed_images_per_s * nodes;
        if (k == 0)
            base = res.timed_images_per_s / n;
        double speedup = base > 0 ? world_ips / base : 0;
        double efficiency = speedup / (n * nodes);
        xs[k] = n;
        ips[k] = world_ips;
        eff[k] = 100 * efficiency;
        double busy_lo = INFINITY, busy_hi = 0;
        cJSON *r = cJSON_CreateObject(), *per = cJSON_CreateArray();
        for (int i = 0; i < n; i++) {
            mgt_step_profile p = res.profile[i];
            double busy = p.forward_s + p.backward_s + p.optimizer_s;
            busy_lo = busy < busy_lo ? busy : busy_lo;
            busy_hi = busy > busy_hi ? busy : busy_hi;
            const char *name = mgt_device_name(mgt_devset_device(set, i));
            if (i == 0)
                printf("%7d %10.1f %8.2f %9.1f%% %9.2f | ", n, world_ips, speedup, 100 * efficiency,
                       1e3 * res.timed_step_s);
            else
                printf("%7s %10s %8s %10s %9s | ", "", "", "", "", "");
            printf("%-9s %8.2f %8.2f %8.2f %8.2f %8.2f\n", name, 1e3 * p.data_s, 1e3 * p.forward_s,
                   1e3 * p.backward_s, 1e3 * p.reduce_exposed_s, 1e3 * p.optimizer_s);
            cJSON *d = cJSON_CreateObject();
            cJSON_AddStringToObject(d, "name", name);
            cJSON_AddNumberToObject(d, "data_s", p.data_s);
            cJSON_AddNumberToObject(d, "forward_s", p.forward_s);
            cJSON_AddNumberToObject(d, "backward_s", p.backward_s);
            cJSON_AddNumberToObject(d, "reduce_exposed_s", p.reduce_exposed_s);
            cJSON_AddNumberToObject(d, "optimizer_s", p.optimizer_s);
            cJSON_AddItemToArray(per, d);
        }
        printf("%7s %10s %8s %10s %9s | spread between the fastest and slowest device: %.2f ms\n",
               "", "", "", "", "", 1e3 * (busy_hi - busy_lo));
        cJSON_AddNumberToObject(r, "devices", n);
        cJSON_AddNumberToObject(r, "images_per_s", world_ips);
        cJSON_AddNumberToObject(r, "speedup", speedup);
        cJSON_AddNumberToObject(r, "efficiency", efficiency);
        cJSON_AddNumberToObject(r, "step_s", res.timed_step_s);
        cJSON_AddNumberToObject(r, "spread_s", busy_hi - busy_lo);
        cJSON_AddItemToObject(r, "per_device", per);
        if (ctl.op_profile)
            print_op_profile(mgt_devset_device(set, 0), steps, r);
        cJSON_AddItemToArray(results, r);
        mgt_devset_free(set);
    }
    printf("(ms per step, device time from events; reduce* = the all-reduce time backward did "
           "not hide; data = the host's wait for the batch)\n");
    if (rc == 0 && json) {
        char *s = cJSON_Print(root);
        FILE *f = fopen(json, "w");
        if (!f || fputs(s, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "mgtrain bench: --json %s: cannot write\n", json);
            rc = 1;
        }
        free(s);
    }
    if (rc == 0 && plot) {
        mgt_plot p = {.title = "mgtrain bench: training step scaling",
                      .x_label = "devices",
                      .panel_title = {"images/s", "scaling efficiency (%)"},
                      .panels = 2,
                      .n_series = 2};
        p.series[0] = (mgt_plot_series){.name = c.arch, .x = xs, .y = ips, .n = nc};
        p.series[1] =
            (mgt_plot_series){.name = "efficiency", .x = xs, .y = eff, .n = nc, .panel = 1};
        if (mgt_plot_write_svg(&p, plot) != MGT_OK) {
            fprintf(stderr, "mgtrain bench: --plot %s\n", mgt_error_last());
            rc = 1;
        }
    }
    cJSON_Delete(root);
    fclose(devnull);
    mgt_world_close(world, rc != 0);
    return rc;
}

/* ---- the all-reduce alone ---- */

static bool parse_size(const char *flag, const char *v, size_t *out)
{
    char *end;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (end == v || *end || !(x > 0) || x * mul < 4 || x * mul > 4.0 * 1024 * 1024 * 1024) {
        fprintf(stderr,
                "mgtrain bench allreduce: %s '%s': expected a size from 4 to 4G, "
                "e.g. 4K or 256M\n",
                flag, v);
        return false;
    }
    *out = (size_t)(x * mul) & ~(size_t)3;
    return true;
}

/* One all-reduce of comm c over every device of every node. */
static mgt_status allreduce_once(mgt_comm *c, mgt_stream **streams, int n, size_t bytes)
{
    mgt_status st = MGT_OK;
    /* one thread drives every device: all mark the bucket ready before any waits */
    for (int i = 0; i < n && st == MGT_OK; i++)
        st = mgt_comm_step_begin(c, i);
    for (int i = 0; i < n && st == MGT_OK; i++)
        st = mgt_comm_grads_ready(c, i, streams[i], bytes);
    for (int i = 0; i < n && st == MGT_OK; i++)
        st = mgt_comm_step_end(c, i, streams[i], NULL);
    for (int i = 0; i < n && st == MGT_OK; i++)
        st = mgt_stream_synchronize(streams[i], NULL);
    return st;
}

/* The all-reduce checked before it is timed: world device g holds g * 7 + e % 13 at float e,
   small integers whose sum is exact in any order, so every float of every device must come
   back as the sum over the world's W devices, 7 W (W - 1) / 2 + W (e % 13). Catches a chunk or
   piece sent, added or landed in the wrong place, or left stale. */
static mgt_status check_allreduce(mgt_comm *c, mgt_devset *set, float **bufs, mgt_stream **streams,
                                  size_t bytes, mgt_world *world)
{
    int n = mgt_devset_count(set), w = n * mgt_world_size(world);
    size_t nf = bytes / sizeof(float);
    float *h = malloc(bytes ? bytes : 1);
    if (!h)
        return mgt_error_set(MGT_ERR_OOM, "bench allreduce: host memory exhausted");
    mgt_status st = MGT_OK;
    for (int i = 0; i < n && st == MGT_OK; i++) {
        int g = mgt_world_rank(world) * n + i;
        for (size_t e = 0; e < nf; e++)
            h[e] = (float)(g * 7 + (int)(e % 13));
        st = mgt_copy_h2d(streams[i], bufs[i], h, bytes);
        if (st == MGT_OK)
            st = mgt_stream_synchronize(streams[i], NULL);
    }
    if (st == MGT_OK)
        st = allreduce_once(c, streams, n, bytes);
    for (int i = 0; i < n && st == MGT_OK; i++) {
        st = mgt_copy_d2h(streams[i], h, bufs[i], bytes);
        if (st == MGT_OK)
            st = mgt_stream_synchronize(streams[i], NULL);
        for (size_t e = 0; e < nf && st == MGT_OK; e++) {
            float want = (float)(7 * w * (w - 1) / 2 + w * (int)(e % 13));
            if (h[e] != want)
                st = mgt_error_set(MGT_ERR_INVALID,
                                   "the all-reduce of %zu bytes gave %g at float %zu of device "
                                   "%d, not the sum %g",
                                   bytes, h[e], e, i, want);
        }
    }
    free(h);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per all-reduce of `bytes` (each device's buffer) with algorithm a, and across nodes
   with exchange x, once check_allreduce has passed: the median of the timed iterations (*mean_s: their mean), so
   that another program's burst on a shared machine moves it less; *bytes_in: what the other nodes sent this one per all-reduce
   over MPI (0 where the exchange does not go through the world: NCCL). */
static mgt_status time_allreduce(mgt_devset *set, float **bufs, mgt_stream **streams, size_t bytes,
                                 mgt_allreduce_algo a, mgt_world *world, mgt_node_exchange x,
                                 double *seconds, double *mean_s, double *bytes_in)
{
    int n = mgt_devset_count(set);
    size_t ends[1] = {bytes};
    mgt_comm_config cc = {.grads = bufs,
                          .bytes = bytes,
                          .layer_ends = ends,
                          .n_layer_ends = 1,
                          .bucket_bytes = bytes,
                          .first_bucket_bytes = bytes,
                          .algo = a,
                          .world = world,
                          .node_exchange = x};
    mgt_comm *c;
    mgt_status st = mgt_comm_create(set, &cc, &c);
    if (st != MGT_OK)
        return st;
    st = check_allreduce(c, set, bufs, streams, bytes, world);
    /* the nodes start together; each iteration's exchange keeps them so */
    if (st == MGT_OK)
        st = mgt_world_barrier(world, NULL);
    enum { MAX_TIMED = 1000 };
    int iters = 0, warm = 2;
    double t0 = 0, now = 0, last = 0, each[MAX_TIMED];
    uint64_t in0 = 0;
    /* at least 5 timed iterations and 0.3 s, at most MAX_TIMED */
    while (st == MGT_OK) {
        if (iters == warm) {
            t0 = last = mgt_time_now();
            in0 = mgt_world_chan_bytes_in(world);
        }
        st = allreduce_once(c, streams, n, bytes);
        now = mgt_time_now();
        if (iters >= warm)
            each[iters - warm] = now - last;
        last = now;
        iters++;
        /* every node must run as many: node 0's count decides, once the minimum is met */
        int more = !(iters >= warm + 5 && (now - t0 > 0.3 || iters >= warm + MAX_TIMED));
        if (st == MGT_OK && mgt_world_size(world) > 1 && iters >= warm + 5)
            st = mgt_world_bcast(world, &more, sizeof more, 0, NULL);
        if (!more)
            break;
    }
    int timed = iters - warm;
    if (st != MGT_OK || timed < 1) {
        mgt_comm_free(c);
        return st;
    }
    *mean_s = (now - t0) / timed;
    qsort(each, (size_t)timed, sizeof *each, cmp_double);
    *seconds = timed % 2 ? each[timed / 2] : (each[timed / 2 - 1] + each[timed / 2]) / 2;
    *bytes_in = (double)(mgt_world_chan_bytes_in(world) - in0) / (iters - warm);
    mgt_comm_free(c);
    return st;
}

/* The link model's prediction: each transfer costs latency + size / bandwidth; the tree's
   2 ceil(log2 n) levels move the whole message, the ring's 2 (n - 1) steps 1/n of it. */
static double predict(mgt_allreduce_algo a, int n, size_t bytes, const mgt_mock_options *o)
{
    if (n == 1 || o->link_bytes_per_s <= 0)
        return 0;
    if (a == MGT_ALLREDUCE_TREE) {
        int levels = 0;
        while ((1 << levels) < n)
            levels++;
        return 2.0 * levels * (o->link_latency_s + (double)bytes / o->link_bytes_per_s);
    }
    return 2.0 * (n - 1) * (o->link_latency_s + (double)bytes / n / o->link_bytes_per_s);
}

/* Across nodes: the reduce-scatter and all-gather inside the node over the mock link (log2 L
   levels each, the shards side by side) and then the exchange of a shard over the inter-node
   link, as mgt_comm models it; x = AUTO gives a ring all-reduce's time for that part instead. */
static double predict_nodes(mgt_node_exchange x, int nodes, int n, size_t bytes,
                            const mgt_mock_options *o)
{
    mgt_link l = {o->xlink_bytes_per_s, o->xlink_latency_s};
    size_t shard = bytes / (size_t)n;
    double t = 0;
    int levels = 0;
    while ((1 << levels) < n)
        levels++;
    if (o->link_bytes_per_s > 0)
        t += 2.0 * levels * (o->link_latency_s + (double)shard / o->link_bytes_per_s);
    return t + (x == MGT_NODE_EXCHANGE_AUTO ? mgt_comm_ring_seconds(nodes, shard, &l)
                                            : mgt_comm_exchange_seconds(x, nodes, shard, &l));
}

/* The --model-nodes table's inputs: a model's gradient buckets, when backward makes each
   ready (a share of backward, by the MACs of the layers backward has gone through: a layer's
   backward costs about twice its forward, alike for all) and a single node's step. */
typedef struct step_model {
    const char *arch;
    size_t grad_bytes;
    int nb;
    size_t ends[256];  /* bucket ends, bytes */
    double ready[256]; /* a bucket's share of backward done when it is ready */
    double forward_s, backward_s, reduce_s, optimizer_s; /* the measured single-node step */
    int devices;                                         /* per node */
} step_model;

/* The buckets of arch's gradients and their ready shares, as train cuts them (25 MiB, the first
   1 MiB: mgt_train_config's defaults). */
static mgt_status plan_model(step_model *m, const char *arch)
{
    const mgt_arch_info *ai = mgt_arch_find(arch);
    if (!ai)
        return mgt_error_set(MGT_ERR_INVALID, "--model-arch '%s': unknown architecture", arch);
    mgt_model_config mc = {.arch = arch,
                           .classes = ai->synthetic_classes,
                           .in_channels = 3,
                           .image_size = ai->synthetic_size,
                           .batch = 1};
    mgt_model *model;
    mgt_status st = mgt_model_create(&mc, NULL, &model); /* a description: no memory */
    if (st != MGT_OK)
        return st;
    int ne = mgt_model_layer_ends(model, NULL, 0);
    size_t *layer_ends = calloc((size_t)ne, sizeof *layer_ends);
    if (!layer_ends) {
        mgt_model_free(model);
        return mgt_error_set(MGT_ERR_OOM, "bench: host memory exhausted");
    }
    mgt_model_layer_ends(model, layer_ends, ne);
    m->arch = arch;
    m->grad_bytes = layer_ends[ne - 1];
    mgt_comm_config cc = {.bytes = m->grad_bytes,
                          .layer_ends = layer_ends,
                          .n_layer_ends = ne,
                          .bucket_bytes = 25u << 20,
                          .first_bucket_bytes = 1u << 20};
    size_t *ends = calloc((size_t)ne, sizeof *ends);
    st = ends ? mgt_comm_plan_buckets(&cc, ends, &m->nb)
              : mgt_error_set(MGT_ERR_OOM, "bench: host memory exhausted");
    if (st == MGT_OK && m->nb > 256)
        st = mgt_error_set(MGT_ERR_UNSUPPORTED, "bench: %s has %d buckets (256 at most)", arch,
                           m->nb);
    for (int b = 0; st == MGT_OK && b < m->nb; b++)
        m->ends[b] = ends[b];
    /* backward walks the layers from the last; the gradient bytes it has made are the prefix
       of the arena up to the layers' parameters so far */
    int nl;
    const mgt_model_layer *layers = mgt_model_layers(model, &nl);
    double total = 0, done = 0;
    for (int i = 0; i < nl; i++)
        total += (double)layers[i].macs;
    size_t made = 0;
    int b = 0;
    for (int i = nl - 1; st == MGT_OK && i >= 0; i--) {
        done += (double)layers[i].macs;
        made += layers[i].params * sizeof(float);
        while (b < m->nb && m->ends[b] <= made)
            m->ready[b++] = total > 0 ? done / total : 1;
    }
    while (b < m->nb)
        m->ready[b++] = 1;
    free(ends);
    free(layer_ends);
    mgt_model_free(model);
    return st;
}

/* The single-node step of m->arch on the set's devices, per_dev images each, timed after a
   warm-up step with the training harness's profile. */
static mgt_status measure_step(step_model *m, mgt_devset *set, long per_dev)
{
    mgt_train_config c;
    mgt_train_config_defaults(&c);
    c.arch = m->arch;
    c.dummy = true;
    c.epochs = 1;
    c.lr.lr = 0.01f;
    c.print_freq = 1 << 30;
    c.workers = 1;
    FILE *devnull = fopen("/dev/null", "w");
    mgt_train_controls ctl = {
        .out = devnull, .profile = true, .warmup_steps = 1, .no_validation = true};
    c.dummy_steps = 3;
    ctl.max_steps = 3;
    c.batch_size = (int)per_dev * mgt_devset_count(set);
    mgt_train_result res;
    mgt_status st = mgt_train_run(&c, &ctl, set, &res);
    if (devnull)
        fclose(devnull);
    if (st != MGT_OK)
        return st;
    m->devices = mgt_devset_count(set);
    m->forward_s = res.profile[0].forward_s;
    m->backward_s = res.profile[0].backward_s;
    m->reduce_s = res.profile[0].reduce_exposed_s;
    m->optimizer_s = res.profile[0].optimizer_s;
    return MGT_OK;
}

/* Per all-reduce and per step at `nodes` nodes with exchange x (AUTO: the ring bound; -1 is
   read as the per-bucket choice of mgt_comm_exchange_pick): the buckets go over each
   device's link one after another, each once backward has made it. */
static void model_step(const step_model *m, int nodes, int x, const mgt_link *l, double *allreduce,
                       double *step)
{
    double link_free = 0, sum = 0;
    for (int b = 0; b < m->nb; b++) {
        size_t bytes = (m->ends[b] - (b ? m->ends[b - 1] : 0)) / (size_t)m->devices;
        mgt_node_exchange e =
            x < 0 ? mgt_comm_exchange_pick(nodes, bytes, l) : (mgt_node_exchange)x;
        double t = e == MGT_NODE_EXCHANGE_AUTO ? mgt_comm_ring_seconds(nodes, bytes, l)
                                               : mgt_comm_exchange_seconds(e, nodes, bytes, l);
        double ready = m->ready[b] * m->backward_s;
        link_free = (ready > link_free ? ready : link_free) + t;
        sum += t;
    }
    *allreduce = sum;
    double tail = link_free > m->backward_s ? link_free : m->backward_s;
    *step = m->forward_s + tail + m->reduce_s + m->optimizer_s;
}

/* The --model-nodes table. */
static void print_model_table(const step_model *m, const int *nodes, int nn, const mgt_link *l,
                              bool modelled, long per_dev, bool measured, cJSON *root)
{
    printf("\nmodel of %s across nodes: %.1f MB of gradients in %d buckets (25 MiB, the first "
           "1 MiB), %d device%s a node (a shard is a bucket / %d), on %s link of %.3g GB/s and "
           "%.3g us\n",
           m->arch, (double)m->grad_bytes / 1e6, m->nb, m->devices, m->devices == 1 ? "" : "s",
           m->devices, modelled ? "the modelled (--mock xlink)" : "an assumed",
           l->bytes_per_s / 1e9, l->latency_s * 1e6);
    printf("single-node step (%s): forward %.1f ms, backward %.1f ms, exposed all-reduce inside "
           "the node %.1f ms, optimizer %.1f ms\n",
           measured ? "measured" : "--model-step", 1e3 * m->forward_s, 1e3 * m->backward_s,
           1e3 * m->reduce_s, 1e3 * m->optimizer_s);
    if (measured)
        printf("  (%ld images a device, synthetic data, after a warm-up step)\n", per_dev);
    printf("buckets ready at these shares of backward (by the MACs of the layers behind them):");
    for (int b = 0; b < m->nb; b++)
        printf(" %.0f%%", 100 * m->ready[b]);
    printf("\nexchanges: allgather (every bucket all-gathered), new (--node-exchange auto: "
           "reduce-scatter + all-gather where the model says it is faster), ring (a ring "
           "all-reduce's time: the bandwidth bound, 2 (N-1)/N of a shard in a node)\n");
    printf("%6s | %-28s | %-28s | %9s %9s\n", "", "     ms per all-reduce", "     ms per step",
           "allgather", "new");
    printf("%6s | %9s %9s %8s | %9s %9s %8s | %9s %9s\n", "nodes", "allgather", "new", "ring",
           "allgather", "new", "ring", "/ new", "/ ring");
    cJSON *rows = cJSON_CreateArray();
    for (int i = 0; i < nn; i++) {
        double ar[3], st[3];
        model_step(m, nodes[i], MGT_NODE_EXCHANGE_ALLGATHER, l, &ar[0], &st[0]);
        model_step(m, nodes[i], -1, l, &ar[1], &st[1]);
        model_step(m, nodes[i], MGT_NODE_EXCHANGE_AUTO, l, &ar[2], &st[2]);
        printf("%6d | %9.1f %9.1f %8.1f | %9.1f %9.1f %8.1f | %9.2f %9.2f\n", nodes[i], 1e3 * ar[0],
               1e3 * ar[1], 1e3 * ar[2], 1e3 * st[0], 1e3 * st[1], 1e3 * st[2], ar[0] / ar[1],
               ar[1] / ar[2]);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "nodes", nodes[i]);
        const char *names[3] = {"allgather", "new", "ring"};
        for (int k = 0; k < 3; k++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "allreduce_s", ar[k]);
            cJSON_AddNumberToObject(o, "step_s", st[k]);
            cJSON_AddItemToObject(r, names[k], o);
        }
        cJSON_AddItemToArray(rows, r);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", m->arch);
    cJSON_AddNumberToObject(o, "grad_bytes", (double)m->grad_bytes);
    cJSON_AddNumberToObject(o, "buckets", m->nb);
    cJSON_AddNumberToObject(o, "forward_s", m->forward_s);
    cJSON_AddNumberToObject(o, "backward_s", m->backward_s);
    cJSON_AddItemToObject(o, "rows", rows);
    cJSON_AddItemToObject(root, "model", o);
}

/* "2,4,8" into nodes (each 2 to 1M, at most cap); false with a message. */
static bool parse_nodes(const char *v, int *nodes, int cap, int *n)
{
    *n = 0;
    const char *p = v;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 2 || x > 1 << 20 || *n == cap || (*end && *end != ',')) {
            fprintf(stderr,
                    "mgtrain bench allreduce: --model-nodes '%s': expected node counts from 2, "
                    "e.g. 2,4,8,16,32,64 (%d at most)\n",
                    v, cap);
            return false;
        }
        nodes[(*n)++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (*n == 0)
        fprintf(stderr, "mgtrain bench allreduce: --model-nodes is empty\n");
    return *n > 0;
}

static int bench_allreduce(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, NULL, B_DEVICE},
        {"gpus", required_argument, NULL, B_GPUS},
        {"mock", required_argument, NULL, B_MOCK},
        {"algo", required_argument, NULL, B_ALGO},
        {"node-exchange", required_argument, NULL, B_NODE_EXCHANGE},
        {"min-bytes", required_argument, NULL, B_MIN},
        {"max-bytes", required_argument, NULL, B_MAX},
        {"model-nodes", required_argument, NULL, B_MODEL_NODES},
        {"model-arch", required_argument, NULL, B_MODEL_ARCH},
        {"model-batch", required_argument, NULL, B_MODEL_BATCH},
        {"model-step", required_argument, NULL, B_MODEL_STEP},
        {"json", required_argument, NULL, B_JSON},
        {"plot", required_argument, NULL, B_PLOT},
        {"help", no_argument, NULL, 'h'},
        MGT_APP_SWITCH_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    mgt_devset_options sw = {0};
    const char *gpus = NULL, *mock = NULL, *json = NULL, *plot = NULL, *algo = "both";
    const char *exch = "both", *model_arch = "resnet50";
    size_t lo = 4096, hi = 256u << 20;
    int model_nodes[32], n_model = 0;
    long model_batch = 8;
    double model_fwd = 0, model_bwd = 0;
    mgt_device_kind kind = MGT_DEVICE_AUTO;
    bool ok = true;
    int opt;
    optind = 1;
    opterr = 0;
    while (ok && (opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (opt) {
        case B_DEVICE:
            ok = mgt_app_parse_device_kind(optarg, &kind) == MGT_OK;
            if (!ok)
                fprintf(stderr, "mgtrain bench allreduce: %s\n", mgt_error_last());
            break;
        case B_GPUS: gpus = optarg; break;
        case B_MOCK: mock = optarg; break;
        case B_ALGO:
            algo = optarg;
            if (strcmp(algo, "tree") && strcmp(algo, "ring") && strcmp(algo, "both")) {
                fprintf(stderr,
                        "mgtrain bench allreduce: --algo '%s': expected tree, ring or "
                        "both\n",
                        algo);
                ok = false;
            }
            break;
        case B_NODE_EXCHANGE:
            exch = optarg;
            if (strcmp(exch, "allgather") && strcmp(exch, "reduce-scatter") &&
                strcmp(exch, "both")) {
                fprintf(stderr,
                        "mgtrain bench allreduce: --node-exchange '%s': expected allgather, "
                        "reduce-scatter or both\n",
                        exch);
                ok = false;
            }
            break;
        case B_MIN: ok = parse_size("--min-bytes", optarg, &lo); break;
        case B_MAX: ok = parse_size("--max-bytes", optarg, &hi); break;
        case B_MODEL_NODES: ok = parse_nodes(optarg, model_nodes, 32, &n_model); break;
        case B_MODEL_ARCH: model_arch = optarg; break;
        case B_MODEL_BATCH:
            ok = mgt_app_flag_int("--model-batch", optarg, 1, 1 << 16, &model_batch);
            break;
        case B_MODEL_STEP: {
            char *end;
            model_fwd = strtod(optarg, &end) / 1e3;
            model_bwd = *end == ',' ? strtod(end + 1, &end) / 1e3 : 0;
            if (*end || !(model_fwd > 0) || !(model_bwd > 0)) {
                fprintf(stderr,
                        "mgtrain bench allreduce: --model-step '%s': expected the forward and "
                        "backward milliseconds of one node's step, e.g. 80,160\n",
                        optarg);
                ok = false;
            }
            break;
        }
        case B_JSON: json = optarg; break;
        case B_PLOT: plot = optarg; break;
        case 'h': bench_usage(stdout); return 0;
        default:
            if (mgt_app_device_switch(opt, &sw))
                break;
            fprintf(stderr, "mgtrain bench allreduce: unknown or incomplete option '%s'\n",
                    argv[optind - 1]);
            ok = false;
        }
    }
    if (!ok)
        return 2;
    if (lo > hi) {
        fprintf(stderr, "mgtrain bench allreduce: --min-bytes is above --max-bytes\n");
        return 2;
    }
    if (n_model > 0 && !mgt_arch_find(model_arch)) {
        fprintf(stderr, "mgtrain bench allreduce: --model-arch '%s': unknown architecture\n",
                model_arch);
        return 2;
    }
    mgt_world *world;
    if (mgt_world_open(&world) != MGT_OK) {
        fprintf(stderr, "mgtrain bench allreduce: %s\n", mgt_error_last());
        return 1;
    }
    int nodes = mgt_world_size(world);
    mgt_app_devices bd = {.kind = kind, .gpus = gpus, .mock = mock, .sw = sw};
    mgt_devset *set = NULL;
    mgt_status ost = mgt_app_open_devices(&bd, 0, &set);
    if (ost == MGT_OK)
        ost = mgt_world_check_devices(world, bd.n);
    if (ost != MGT_OK) {
        fprintf(stderr, "mgtrain bench allreduce: %s\n", mgt_error_last());
        mgt_devset_free(set);
        mgt_world_close(world, true);
        return mgt_app_device_exit(ost);
    }
    const mgt_mock_options mo = bd.mock_opts; /* zeroed unless mock devices */
    mgt_world_set_link(world, mo.xlink_bytes_per_s, mo.xlink_latency_s);
    if (mgt_world_rank(world) != 0) { /* node 0 reports */
        json = plot = NULL;
        if (!freopen("/dev/null", "w", stdout))
            clearerr(stdout);
    }
    int n = bd.n, wn = n * nodes;
    bool model = nodes > 1 ? mo.xlink_bytes_per_s > 0 : mo.link_bytes_per_s > 0;
    /* one node: tree and ring; several: today's all-gather and the reduce-scatter, both
       hierarchical; in a world of one with --model-nodes, only the model */
    struct variant {
        const char *name, *key;
        mgt_allreduce_algo algo;
        mgt_node_exchange x;
    } vs[2];
    int na = 0;
    if (nodes > 1) {
        if (strcmp(exch, "reduce-scatter") != 0)
            vs[na++] = (struct variant){"allgather", "allgather", MGT_ALLREDUCE_TREE,
                                        MGT_NODE_EXCHANGE_ALLGATHER};
        if (strcmp(exch, "allgather") != 0)
            vs[na++] = (struct variant){"reduce-scatter", "reduce_scatter", MGT_ALLREDUCE_TREE,
                                        MGT_NODE_EXCHANGE_REDUCE_SCATTER};
    } else if (n_model == 0) {
        if (strcmp(algo, "ring") != 0)
            vs[na++] = (struct variant){"tree", "tree", MGT_ALLREDUCE_TREE, 0};
        if (strcmp(algo, "tree") != 0)
            vs[na++] = (struct variant){"ring", "ring", MGT_ALLREDUCE_RING, 0};
    }
    mgt_buffer *buf[MGT_MAX_DEVICES] = {0};
    float *ptr[MGT_MAX_DEVICES];
    mgt_stream *streams[MGT_MAX_DEVICES] = {0};
    mgt_status st = MGT_OK;
    for (int i = 0; i < n && st == MGT_OK && na > 0; i++) {
        mgt_device *d = mgt_devset_device(set, i);
        st = mgt_buffer_alloc(d, hi, &buf[i]);
        if (st == MGT_OK)
            st = mgt_stream_create(d, &streams[i]);
        if (st == MGT_OK) {
            ptr[i] = mgt_buffer_ptr(buf[i]);
            st = mgt_fill(streams[i], ptr[i], 1e-3f, hi / sizeof(float));
        }
    }
    if (na > 0 && nodes > 1)
        printf("mgtrain bench allreduce: %d nodes x %d %s devices = %d; busbw = algbw * 2(n-1)/n "
               "(nccl-tests); time: the median of the timed iterations\nacross nodes: allgather "
               "(every node's shard gathered and added, the exchange before reduce-scatter "
               "existed), reduce-scatter (pieces all-to-all, added, all-gathered); in/size: the "
               "bytes MPI brought into a node, over the message's\n",
               nodes, n, mgt_device_kind_name(bd.kind), wn);
    else if (na > 0)
        printf("mgtrain bench allreduce: %d %s devices; busbw = algbw * 2(n-1)/n (nccl-tests); "
               "time: the median of the timed iterations\n",
               n, mgt_device_kind_name(bd.kind));
    if (na > 0 && mo.link_bytes_per_s > 0)
        printf("mock link model: %.3g GB/s, %.3g us per peer copy; 'model' = the time it "
               "predicts\n",
               mo.link_bytes_per_s / 1e9, mo.link_latency_s * 1e6);
    if (na > 0 && nodes > 1 && model)
        printf("mock inter-node link: %.3g GB/s, %.3g us per device; model = 2 log2(L) (lat + "
               "shard/bw) inside the node + the exchange's time on the link (chunks x steps x "
               "xlat + bytes in / xbw); ring = a ring all-reduce's time for the exchange, 2 (N-1) "
               "(xlat + shard / (N xbw))\n",
               mo.xlink_bytes_per_s / 1e9, mo.xlink_latency_s * 1e6);
    if (na > 0) {
        printf("%12s", "size");
        for (int a = 0; a < na; a++)
            printf(" | %-14s %9s %9s %9s%s%s", vs[a].name, "time us", "algbw", "busbw",
                   nodes > 1 ? "  in/size" : "", model ? "  model us" : "");
        if (model && nodes > 1)
            printf(" | %9s", "ring us");
        if (na == 2)
            printf(" | %s/%s%s", vs[0].name, vs[1].name, model ? " (model)" : "");
        if (model && nodes > 1)
            printf(" | %s/ring", vs[na - 1].name);
        printf("\n");
    }
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    cJSON_AddNumberToObject(root, "devices", wn);
    cJSON_AddNumberToObject(root, "nodes", nodes);
    cJSON_AddStringToObject(root, "device_kind", mgt_device_kind_name(bd.kind));
    cJSON_AddItemToObject(root, "results", rows);
    double sizes[64], busbw[2][64];
    int ns = 0;
    for (size_t bytes = lo; na > 0 && bytes <= hi && st == MGT_OK && ns < 64; bytes *= 2, ns++) {
        double t[2] = {0, 0}, pm[2] = {0, 0}, in[2] = {0, 0}, mean[2] = {0, 0};
        printf("%12zu", bytes);
        cJSON *row = cJSON_CreateObject();
        cJSON_AddNumberToObject(row, "bytes", (double)bytes);
        for (int a = 0; a < na && st == MGT_OK; a++) {
            st = time_allreduce(set, ptr, streams, bytes, vs[a].algo, world, vs[a].x, &t[a],
                                &mean[a], &in[a]);
            double alg = (double)bytes / t[a] / 1e9, bus = alg * 2.0 * (wn - 1) / wn;
            pm[a] = nodes > 1 ? predict_nodes(vs[a].x, nodes, n, bytes, &mo)
                              : predict(vs[a].algo, n, bytes, &mo);
            printf(" | %-14s %9.1f %8.3gG %8.3gG", "", t[a] * 1e6, alg, bus);
            /* what crossed into this node, as a multiple of the message (not counted on NCCL) */
            if (nodes > 1 && in[a] > 0)
                printf(" %8.3fx", in[a] / (double)bytes);
            else if (nodes > 1)
                printf(" %9s", "-");
            if (model)
                printf(" %9.1f", pm[a] * 1e6);
            busbw[a][ns] = bus;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "time_s", t[a]);
            cJSON_AddNumberToObject(o, "mean_s", mean[a]);
            cJSON_AddNumberToObject(o, "algbw_gbs", alg);
            cJSON_AddNumberToObject(o, "busbw_gbs", bus);
            if (nodes > 1)
                cJSON_AddNumberToObject(o, "bytes_in", in[a]);
            if (model)
                cJSON_AddNumberToObject(o, "model_s", pm[a]);
            cJSON_AddItemToObject(row, vs[a].key, o);
        }
        double ring =
            model && nodes > 1 ? predict_nodes(MGT_NODE_EXCHANGE_AUTO, nodes, n, bytes, &mo) : 0;
        if (st == MGT_OK && ring > 0) {
            printf(" | %9.1f", ring * 1e6);
            cJSON_AddNumberToObject(row, "ring_model_s", ring);
        }
        if (na == 2 && st == MGT_OK) {
            printf(" | %6.2f", t[0] / t[1]);
            if (model)
                printf(" (%.2f)", pm[0] / pm[1]);
        }
        if (st == MGT_OK && ring > 0)
            printf(" | %6.2f", t[na - 1] / ring);
        printf("\n");
        fflush(stdout);
        sizes[ns] = (double)bytes;
        cJSON_AddItemToArray(rows, row);
    }
    int rc = 0;
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain bench allreduce: %s\n", mgt_error_last());
        rc = 1;
    }
    /* the model table: node 0 alone measures the step (the others have nothing to add) */
    if (rc == 0 && n_model > 0 && mgt_world_rank(world) == 0) {
        step_model sm = {0};
        mgt_link l = {mo.xlink_bytes_per_s, mo.xlink_latency_s};
        bool modelled = l.bytes_per_s > 0;
        if (!modelled)
            l = mgt_comm_assumed_link();
        st = plan_model(&sm, model_arch);
        if (st == MGT_OK && model_fwd > 0) {
            sm.forward_s = model_fwd;
            sm.backward_s = model_bwd;
            sm.devices = n;
        } else if (st == MGT_OK) {
            st = measure_step(&sm, set, model_batch);
        }
        if (st == MGT_OK)
            print_model_table(&sm, model_nodes, n_model, &l, modelled, model_batch, model_fwd == 0,
                              root);
        if (st != MGT_OK) {
            fprintf(stderr, "mgtrain bench allreduce: --model-nodes: %s\n", mgt_error_last());
            rc = 1;
        }
    }
    if (rc == 0 && json) {
        char *s = cJSON_Print(root);
        FILE *f = fopen(json, "w");
        if (!f || fputs(s, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "mgtrain bench allreduce: --json %s: cannot write\n", json);
            rc = 1;
        }
        free(s);
    }
    if (rc == 0 && plot && na > 0) {
        mgt_plot p = {.title = "mgtrain bench allreduce: bus bandwidth (GB/s)",
                      .x_label = "message size",
                      .panel_title = {"busbw GB/s"},
                      .panels = 1,
                      .log2_x = true,
                      .x_bytes = true,
                      .n_series = na};
        for (int a = 0; a < na; a++)
            p.series[a] = (mgt_plot_series){.name = vs[a].name, .x = sizes, .y = busbw[a], .n = ns};
        if (mgt_plot_write_svg(&p, plot) != MGT_OK) {
            fprintf(stderr, "mgtrain bench allreduce: --plot %s\n", mgt_error_last());
            rc = 1;
        }
    }
    cJSON_Delete(root);
    for (int i = 0; i < n; i++) {
        mgt_stream_free(streams[i]);
        mgt_buffer_free(buf[i]);
    }
    mgt_devset_free(set);
    mgt_world_close(world, rc != 0);
    return rc;
}
