/* `mgtrain train` (also `mgtrain --data DIR ...` or `mgtrain DIR ...` without a command): the
   trainer's flags, each validated with a message naming it (exit 2), the run (exit 1 when it
   cannot be done or fails), Ctrl-C as a stop at the next step boundary (exit 128 + signal). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/app.h"
#include "app/commands.h"
#include "mgt/nn.h"
#include "mgt/train.h"

/* The signal that asked for a stop (0: none). */
static atomic_int stop_requested;

/* SIGINT (Ctrl-C) and SIGTERM: stop at the next step boundary with a checkpoint. */
static void on_sigint(int sig)
{
    if (atomic_load(&stop_requested)) {
        /* a second signal: the user wants out now; one line (write(2) is async-signal-safe)
           says that the run ends unsaved and the last checkpoint stays as it was */
        static const char line[] = "\nmgtrain: a second interrupt: quitting now, without saving "
                                   "(the last checkpoint written stays as it was)\n";
        ssize_t ignored = write(STDERR_FILENO, line, sizeof line - 1);
        (void)ignored;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    atomic_store(&stop_requested, sig);
}

/* A failed run's one line. On several nodes it names the node and goes to the others (which
   then stop without a line of their own); a failure that was another node's (remote) prints
   nothing here. A node that failed on its own prints its line even where another node's
   message came in meanwhile: both failed, and each says why (before, each saw the other's
   message and neither printed anything). */
static void train_fail_line(mgt_world *w, const char *text, bool remote)
{
    if (remote)
        return;
    if (mgt_world_size(w) == 1) {
        fprintf(stderr, "mgtrain: %s\n", text);
        return;
    }
    char line[1024];
    /* bounded: a host name and an error text each fit their part of the line */
    snprintf(line, sizeof line, "node %d of %d (%.64s): %.900s", mgt_world_rank(w),
             mgt_world_size(w), mgt_world_host(w), text);
    fprintf(stderr, "mgtrain: %s\n", line);
    fflush(stderr);
    mgt_world_notify_failure(w, line);
}

static void train_usage(FILE *f)
{
    fprintf(
        f,
        "usage: mgtrain [train] DIR [options]     (or --data DIR, or --dummy for no data)\n"
        "\n"
        "data\n"
        "  DIR, --data DIR        ImageFolder tree: DIR/train/<class>/*, DIR/val/<class>/*;\n"
        "                         or a pack (mgtrain pack), or a folder of train.pack, val.pack\n"
        "  --dummy                synthetic data (fixed random batches), no files\n"
        "  -j, --workers N        image decode threads in total (default: one per core)\n"
        "  --image-size S         training/validation side (default: the checkpoint's with\n"
        "                         -e or --resume, else the family's: see below)\n"
        "  --augment KIND         rrc | pad-crop | none (default: the family's)\n"
        "  --mean A[,B,C]         per-channel mean on the 0..1 scale (default: ImageNet's)\n"
        "  --std A[,B,C]          per-channel std (default: ImageNet's)\n"
        "  --normalize auto       compute mean and std from the training images first\n"
        "  --strict-data          any unreadable image is fatal\n"
        "  --max-bad-frac F       abort past this fraction of unreadable images (0.01)\n"
        "  --exact-decode         JPEGs decoded whole at full scale, torchvision's pixels "
        "(default:\n"
        "                         at the DCT scale that covers the crop, only the crop's region)\n"
        "torchvision's references recipe\n"
        "  --train-crop-size S    the training crop (= --image-size)\n"
        "  --val-resize-size S    validation: the shorter side before the centre crop\n"
        "  --val-crop-size S      validation crop; another than the training size validates\n"
        "                         at it (FixRes: --train-crop-size 176 --val-crop-size 224)\n"
        "  --interpolation M      bilinear | bicubic | nearest, resizes and policy ops (bilinear)\n"
        "  --auto-augment P       ta_wide | ra | imagenet | cifar10 | svhn | augmix:\n"
        "                         TrivialAugmentWide, RandAugment, AutoAugment's policies,\n"
        "                         AugMix (none)\n"
        "  --augmix-severity N    AugMix's severity, 1..10 (3)\n"
        "  --ra-magnitude N       RandAugment's magnitude bin, 0..30 (9; the other policies\n"
        "                         ignore it, as the references do)\n"
        "  --ra-sampler           repeated augmentation, torchvision's RASampler: each image\n"
        "                         --ra-reps times per epoch, the copies on different devices\n"
        "                         and augmented apart; an epoch keeps n // 256 * 256 samples\n"
        "  --ra-reps N            repetitions of --ra-sampler (3)\n"
        "  --random-erase P       RandomErasing's probability (0)\n"
        "  --mixup-alpha A        mixup with lambda ~ Beta(A, A) (0: off)\n"
        "  --cutmix-alpha A       cutmix with lambda ~ Beta(A, A) (0: off; with mixup, one of\n"
        "                         the two per sample, even odds)\n"
        "model\n"
        "  -a, --arch NAME        one of the architectures below (`mgtrain model` lists them\n"
        "                         with sizes); default: the checkpoint's, else resnet18\n"
        "  --pretrained FILE      start from safetensors weights with torchvision names; the\n"
        "                         head is re-initialised for another class count, the stem\n"
        "                         adapted to other input channels (a .pth: convert it with\n"
        "                         scripts/pth_to_safetensors.py)\n"
        "  --aux-logits on|off    inception_v3's and googlenet's auxiliary classifiers, trained\n"
        "                         beside the main one (on; googlenet under --pretrained: off)\n"
        "  --aux-weight X         each auxiliary loss's weight in the loss (inception_v3 0.4,\n"
        "                         googlenet 0.3)\n"
        "  --transform-input on|off  inception_v3's and googlenet's input map to the\n"
        "                         normalisation of their ported weights (on under --pretrained)\n"
        "  --zero-init-residual   zero the last BN weight of each residual block\n"
        "  --freeze-bn            batch norm uses its running statistics in training too\n"
        "  --sync-bn              batch norm statistics over every device's batch together\n"
        "                         (PyTorch's SyncBatchNorm; the devices of one node)\n"
        "  --amp [bf16|fp16|off]  mixed precision as torch.autocast: convolutions and linear\n"
        "                         layers on 16-bit inputs with fp32 sums; fp16 with dynamic\n"
        "                         loss scaling (GradScaler's: 2^16, x2 per 2000 steps, x0.5);\n"
        "                         bare, as the references: fp16 on CUDA, bf16 on mock devices\n"
        "  --grad-dtype f32|bf16  the gradient all-reduce's precision (f32)\n"
        "optimisation\n"
        "  --epochs N             (90)          --start-epoch N   (0, or the checkpoint's)\n"
        "  -b, --batch-size N     total over all devices (256); each device gets int(N/devices)\n"
        "  --lr X (0.1)  --momentum X (0.9)  --wd, --weight-decay X (1e-4)  --nesterov\n"
        "  --opt NAME             sgd | sgd_nesterov | adamw | rmsprop, PyTorch's (sgd); adamw:\n"
        "                         betas 0.9, 0.999, eps 1e-8, decoupled decay; rmsprop: alpha\n"
        "                         0.9, eps 0.0316, --momentum (torchvision's references)\n"
        "  --norm-weight-decay X  weight decay of norm layers' weights and biases, batch and\n"
        "                         layer norms (--wd)\n"
        "  --bias-weight-decay X  weight decay of every parameter named bias, norms' too (--wd)\n"
        "  --transformer-embedding-decay X  weight decay of the parameters named class_token,\n"
        "                         position_embedding and relative_position_bias_table (--wd)\n"
        "  --lr-schedule step|cosine (step)  --lr-step N (30)  --lr-gamma X (0.1)\n"
        "  --warmup-epochs X      linear warm-up, per step; fractions allowed (0)\n"
        "  (step and cosine are mgtrain's: cosine decays per step; the references' schedulers\n"
        "  below step once per epoch, as torchvision's train.py does)\n"
        "  --lr-scheduler NAME    steplr | cosineannealinglr | exponentiallr\n"
        "  --lr-step-size N       steplr's step_size (= --lr-step, 30)\n"
        "  --lr-min X             cosineannealinglr's eta_min (0)\n"
        "  --lr-warmup-epochs N   warm-up epochs before the --lr-scheduler one (0)\n"
        "  --lr-warmup-method M   linear | constant (constant)\n"
        "  --lr-warmup-decay X    the warm-up's factor of --lr at its start (0.01)\n"
        "  --label-smoothing X    (0)\n"
        "  --clip-grad-norm X     clip the mean gradients' global L2 norm to X (off)\n"
        "  --accum-steps K        K micro-batches of -b per update and per all-reduce (1)\n"
        "  --model-ema            keep an EMA of weights and BN buffers, validated beside the\n"
        "                         model and checkpointed as model_ema.* (the references')\n"
        "  --model-ema-decay X    (0.99998) adjusted as train.py does: 1 - min(1, (1 - X) *\n"
        "                         b * K * steps / epochs)\n"
        "  --model-ema-steps N    update the EMA every N updates (32)\n"
        "  --seed N               (0)\n"
        "devices\n"
        "  --gpus LIST            device ids, e.g. 0,1,2,3; ids may repeat (default: all)\n"
        "  --device auto|cuda|cpu auto: CUDA where present, else CPU mock devices\n"
        "  --mock SPEC            mock-device options (see README)\n"
        "  --bucket-mb N          gradient all-reduce bucket size in MiB (25)\n"
        "  --allreduce tree|ring  the all-reduce algorithm (tree)\n"
        "  --node-exchange auto|allgather|reduce-scatter\n"
        "                         how shards cross the nodes under mpirun (auto: per "
        "bucket)\n" MGT_APP_SWITCH_USAGE "run\n"
        "  -p, --print-freq N     progress line every N steps (10)\n"
        "  -e, --evaluate         validate once and stop (the checkpoint of --resume or\n"
        "                         --pretrained, with its architecture, size and transform)\n"
        "  --per-class            -e: every class's top-1 (default: the five lowest)\n"
        "  --confusion FILE.csv   -e: the confusion matrix with class names\n"
        "  --resume PATH|auto     continue from a checkpoint (auto: CHECKPOINT_DIR's, if any)\n"
        "  --checkpoint-dir DIR   where checkpoint.safetensors and model_best.safetensors go;\n"
        "                         one that holds another run's needs --resume or --overwrite\n"
        "  --overwrite            start afresh over CHECKPOINT_DIR's checkpoints\n"
        "  --keep-last N          also keep the last N epochs as model_<epoch>.safetensors\n"
        "  --log FILE             JSON lines: the configuration first, then one per progress\n"
        "                         line and one per epoch (with --checkpoint-dir, curves.svg\n"
        "                         there is drawn from it after each epoch)\n"
        "  --tensorboard DIR      TensorBoard event files (scalars, the configuration, the\n"
        "                         step per device) in DIR\n"
        "  --time-limit SECONDS   stop with a checkpoint after this long\n"
        "  --timeout SECONDS      abort when no step finishes for this long\n"
        "  --on-device-failure abort|continue  on a device's failure in training, end the\n"
        "                         run (abort, the default) or drop the device and go on\n"
        "                         with the others from the failed step (one node)\n"
        "  --min-devices N        continue: the fewest devices to go on with (1)\n"
        "  --device-timeout SECONDS  a device whose work makes no progress this long has\n"
        "                         failed (default: --timeout, else 600)\n"
        "  --max-steps N          at most N training steps per epoch (quick runs)\n"
        "  --dummy-steps N        steps per epoch with --dummy (100)\n"
        "torchvision's references' names: --model (-a), --data-path (--data), --output-dir\n"
        "(--checkpoint-dir), --test-only (-e), --lr-scheduler, --lr-warmup-*, --amp; -b is the\n"
        "total over all devices here (per GPU there).\n"
        "Ctrl-C or SIGTERM stops at the next step boundary and saves a checkpoint (exit status\n"
        "128 + the signal: 130, 143); a second one quits at once. Bad flags exit 2; a run that\n"
        "cannot be done or fails exits 1.\n");
    fprintf(f,
            "\narchitectures (%d; `mgtrain model` for sizes, `mgtrain model -a NAME` for the "
            "layers):\n",
            mgt_app_arch_count());
    mgt_app_print_archs(f);
    fprintf(f, "\neach family's defaults (--image-size, --augment, the validation transform):\n");
    mgt_app_print_family_defaults(f);
}

/* "0.5" or "0.485,0.456,0.406" */
static bool parse_triple(const char *flag, const char *v, float out[3], bool positive)
{
    double x[3];
    int n = 0;
    const char *p = v;
    while (n < 3) {
        char *end;
        errno = 0;
        x[n] = strtod(p, &end);
        if (errno || end == p || !isfinite(x[n]) || (positive && x[n] <= 0) ||
            (*end && *end != ','))
            break;
        n++;
        if (!*end) {
            p = end;
            break;
        }
        p = end + 1;
    }
    if (*p || (n != 1 && n != 3)) {
        fprintf(stderr, "mgtrain: %s '%s': expected one number or three separated by commas%s\n",
                flag, v, positive ? ", each above 0" : "");
        return false;
    }
    for (int i = 0; i < 3; i++)
        out[i] = (float)x[n == 1 ? 0 : i];
    return true;
}

enum {
    OPT_DATA = 256,
    OPT_DUMMY,
    OPT_IMAGE_SIZE,
    OPT_AUGMENT,
    OPT_MEAN,
    OPT_STD,
    OPT_NORMALIZE,
    OPT_STRICT,
    OPT_MAX_BAD,
    OPT_PRETRAINED,
    OPT_ZIR,
    OPT_EPOCHS,
    OPT_START_EPOCH,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WD,
    OPT_NESTEROV,
    OPT_SCHEDULE,
    OPT_LR_STEP,
    OPT_LR_GAMMA,
    OPT_WARMUP,
    OPT_SMOOTHING,
    OPT_SEED,
    OPT_GPUS,
    OPT_DEVICE,
    OPT_MOCK,
    OPT_BUCKET,
    OPT_RESUME,
    OPT_CKPT,
    OPT_LOG,
    OPT_TENSORBOARD,
    OPT_TIME_LIMIT,
    OPT_TIMEOUT,
    OPT_ON_DEVICE_FAILURE,
    OPT_MIN_DEVICES,
    OPT_DEVICE_TIMEOUT,
    OPT_MAX_STEPS,
    OPT_DUMMY_STEPS,
    OPT_ALLREDUCE,
    OPT_NODE_EXCHANGE,
    OPT_FREEZE_BN,
    OPT_SYNC_BN,
    OPT_EXACT_DECODE,
    OPT_VAL_RESIZE,
    OPT_VAL_CROP,
    OPT_INTERP,
    OPT_AUTO_AUGMENT,
    OPT_RANDOM_ERASE,
    OPT_MIXUP,
    OPT_CUTMIX,
    OPT_AMP,
    OPT_GRAD_DTYPE,
    OPT_OPT,
    OPT_NORM_WD,
    OPT_BIAS_WD,
    OPT_EMBED_WD,
    OPT_RA_MAGNITUDE,
    OPT_RA_SAMPLER,
    OPT_RA_REPS,
    OPT_LR_SCHEDULER,
    OPT_LR_MIN,
    OPT_LR_WARMUP_EPOCHS,
    OPT_LR_WARMUP_METHOD,
    OPT_LR_WARMUP_DECAY,
    OPT_CLIP,
    OPT_ACCUM,
    OPT_EMA,
    OPT_EMA_DECAY,
    OPT_EMA_STEPS,
    OPT_KEEP_LAST,
    OPT_OVERWRITE,
    OPT_PER_CLASS,
    OPT_CONFUSION,
    OPT_AUGMIX_SEVERITY,
    OPT_AUX_LOGITS,
    OPT_AUX_WEIGHT,
    OPT_TRANSFORM_INPUT,
};

/* Whether v is a value of --amp: `--amp bf16` takes it, a bare --amp (the references'
   switch) leaves the next word alone. */
static bool is_amp_word(const char *v)
{
    return v && (strcmp(v, "bf16") == 0 || strcmp(v, "fp16") == 0 || strcmp(v, "f32") == 0 ||
                 strcmp(v, "fp32") == 0 || strcmp(v, "off") == 0 || strcmp(v, "auto") == 0);
}

/* The flags as a whole, after each was parsed: the dataset (--data, or the one positional
   argument), the architecture, and the combinations that contradict each other. */
static bool check_flags(mgt_train_config *c, int argc, char **argv)
{
    if (optind < argc) {
        if (optind + 1 < argc) {
            fprintf(stderr, "mgtrain: unexpected argument '%s' (one dataset folder at most)\n",
                    argv[optind + 1]);
            return false;
        }
        if (c->data_dir) {
            fprintf(stderr, "mgtrain: the dataset is given twice: '%s' and --data %s\n",
                    argv[optind], c->data_dir);
            return false;
        }
        c->data_dir = argv[optind];
    }
    if (!c->data_dir && !c->dummy) {
        fprintf(stderr, "mgtrain: a dataset folder is required (mgtrain DIR, --data DIR, or "
                        "--dummy for synthetic data)\n");
        return false;
    }
    if (c->data_dir && c->dummy) {
        fprintf(stderr, "mgtrain: --data and --dummy exclude each other\n");
        return false;
    }
    if (c->normalize_auto && c->mean_std_set) {
        fprintf(stderr, "mgtrain: --normalize auto and --mean/--std exclude each other\n");
        return false;
    }
    if (c->evaluate && c->dummy) {
        fprintf(stderr, "mgtrain: --evaluate needs a dataset: --dummy has no validation split\n");
        return false;
    }
    if (c->resume && strcmp(c->resume, "auto") == 0 && !c->checkpoint_dir) {
        fprintf(stderr, "mgtrain: --resume auto: there is nothing to resume from without "
                        "--checkpoint-dir\n");
        return false;
    }
    if (c->nesterov && c->opt != MGT_OPT_SGD && c->opt != MGT_OPT_SGD_NESTEROV) {
        fprintf(stderr, "mgtrain: --nesterov is SGD's: --opt %s has no Nesterov form\n",
                mgt_opt_kind_name(c->opt));
        return false;
    }
    if ((c->nesterov || c->opt == MGT_OPT_SGD_NESTEROV) && c->momentum <= 0) {
        fprintf(stderr, "mgtrain: Nesterov momentum needs --momentum above 0\n");
        return false;
    }
    if (c->arch && !mgt_arch_find(c->arch)) {
        fprintf(stderr, "mgtrain: --arch '%s': unknown architecture; the %d known:\n", c->arch,
                mgt_app_arch_count());
        mgt_app_print_archs(stderr);
        return false;
    }
    return true;
}

int mgt_app_cmd_train(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"data", required_argument, NULL, OPT_DATA},
        {"data-path", required_argument, NULL, OPT_DATA}, /* the references' names */
        {"model", required_argument, NULL, 'a'},
        {"output-dir", required_argument, NULL, OPT_CKPT},
        {"test-only", no_argument, NULL, 'e'},
        {"dummy", no_argument, NULL, OPT_DUMMY},
        {"workers", required_argument, NULL, 'j'},
        {"image-size", required_argument, NULL, OPT_IMAGE_SIZE},
        {"augment", required_argument, NULL, OPT_AUGMENT},
        {"mean", required_argument, NULL, OPT_MEAN},
        {"std", required_argument, NULL, OPT_STD},
        {"normalize", required_argument, NULL, OPT_NORMALIZE},
        {"strict-data", no_argument, NULL, OPT_STRICT},
        {"max-bad-frac", required_argument, NULL, OPT_MAX_BAD},
        {"arch", required_argument, NULL, 'a'},
        {"pretrained", required_argument, NULL, OPT_PRETRAINED},
        {"zero-init-residual", no_argument, NULL, OPT_ZIR},
        {"aux-logits", required_argument, NULL, OPT_AUX_LOGITS},
        {"aux-weight", required_argument, NULL, OPT_AUX_WEIGHT},
        {"transform-input", required_argument, NULL, OPT_TRANSFORM_INPUT},
        {"epochs", required_argument, NULL, OPT_EPOCHS},
        {"start-epoch", required_argument, NULL, OPT_START_EPOCH},
        {"batch-size", required_argument, NULL, 'b'},
        {"lr", required_argument, NULL, OPT_LR},
        {"learning-rate", required_argument, NULL, OPT_LR},
        {"momentum", required_argument, NULL, OPT_MOMENTUM},
        {"wd", required_argument, NULL, OPT_WD},
        {"weight-decay", required_argument, NULL, OPT_WD},
        {"nesterov", no_argument, NULL, OPT_NESTEROV},
        {"lr-schedule", required_argument, NULL, OPT_SCHEDULE},
        {"lr-step", required_argument, NULL, OPT_LR_STEP},
        {"lr-step-size", required_argument, NULL, OPT_LR_STEP},
        {"lr-scheduler", required_argument, NULL, OPT_LR_SCHEDULER},
        {"lr-min", required_argument, NULL, OPT_LR_MIN},
        {"lr-warmup-epochs", required_argument, NULL, OPT_LR_WARMUP_EPOCHS},
        {"lr-warmup-method", required_argument, NULL, OPT_LR_WARMUP_METHOD},
        {"lr-warmup-decay", required_argument, NULL, OPT_LR_WARMUP_DECAY},
        {"lr-gamma", required_argument, NULL, OPT_LR_GAMMA},
        {"warmup-epochs", required_argument, NULL, OPT_WARMUP},
        {"label-smoothing", required_argument, NULL, OPT_SMOOTHING},
        {"seed", required_argument, NULL, OPT_SEED},
        {"gpus", required_argument, NULL, OPT_GPUS},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"mock", required_argument, NULL, OPT_MOCK},
        {"bucket-mb", required_argument, NULL, OPT_BUCKET},
        {"allreduce", required_argument, NULL, OPT_ALLREDUCE},
        {"node-exchange", required_argument, NULL, OPT_NODE_EXCHANGE},
        {"freeze-bn", no_argument, NULL, OPT_FREEZE_BN},
        {"sync-bn", no_argument, NULL, OPT_SYNC_BN},
        {"exact-decode", no_argument, NULL, OPT_EXACT_DECODE},
        {"train-crop-size", required_argument, NULL, OPT_IMAGE_SIZE},
        {"val-resize-size", required_argument, NULL, OPT_VAL_RESIZE},
        {"val-crop-size", required_argument, NULL, OPT_VAL_CROP},
        {"interpolation", required_argument, NULL, OPT_INTERP},
        {"auto-augment", required_argument, NULL, OPT_AUTO_AUGMENT},
        {"random-erase", required_argument, NULL, OPT_RANDOM_ERASE},
        {"mixup-alpha", required_argument, NULL, OPT_MIXUP},
        {"cutmix-alpha", required_argument, NULL, OPT_CUTMIX},
        {"amp", optional_argument, NULL, OPT_AMP},
        {"grad-dtype", required_argument, NULL, OPT_GRAD_DTYPE},
        {"opt", required_argument, NULL, OPT_OPT},
        {"clip-grad-norm", required_argument, NULL, OPT_CLIP},
        {"accum-steps", required_argument, NULL, OPT_ACCUM},
        {"model-ema", no_argument, NULL, OPT_EMA},
        {"model-ema-decay", required_argument, NULL, OPT_EMA_DECAY},
        {"model-ema-steps", required_argument, NULL, OPT_EMA_STEPS},
        {"norm-weight-decay", required_argument, NULL, OPT_NORM_WD},
        {"bias-weight-decay", required_argument, NULL, OPT_BIAS_WD},
        {"transformer-embedding-decay", required_argument, NULL, OPT_EMBED_WD},
        {"ra-magnitude", required_argument, NULL, OPT_RA_MAGNITUDE},
        {"ra-sampler", no_argument, NULL, OPT_RA_SAMPLER},
        {"ra-reps", required_argument, NULL, OPT_RA_REPS},
        MGT_APP_SWITCH_LONGOPTS,
        {"print-freq", required_argument, NULL, 'p'},
        {"evaluate", no_argument, NULL, 'e'},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"checkpoint-dir", required_argument, NULL, OPT_CKPT},
        {"keep-last", required_argument, NULL, OPT_KEEP_LAST},
        {"overwrite", no_argument, NULL, OPT_OVERWRITE},
        {"per-class", no_argument, NULL, OPT_PER_CLASS},
        {"confusion", required_argument, NULL, OPT_CONFUSION},
        {"augmix-severity", required_argument, NULL, OPT_AUGMIX_SEVERITY},
        {"log", required_argument, NULL, OPT_LOG},
        {"tensorboard", required_argument, NULL, OPT_TENSORBOARD},
        {"time-limit", required_argument, NULL, OPT_TIME_LIMIT},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"on-device-failure", required_argument, NULL, OPT_ON_DEVICE_FAILURE},
        {"min-devices", required_argument, NULL, OPT_MIN_DEVICES},
        {"device-timeout", required_argument, NULL, OPT_DEVICE_TIMEOUT},
        {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
        {"dummy-steps", required_argument, NULL, OPT_DUMMY_STEPS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    mgt_train_config c;
    mgt_train_config_defaults(&c);
    mgt_train_controls ctl = {0};
    const char *gpus = NULL, *mock = NULL;
    mgt_device_kind kind = MGT_DEVICE_AUTO;
    mgt_devset_options sw = {0};
    /* which schedule family the flags chose: mgtrain's (--lr-schedule, --warmup-epochs) or
       the references' (--lr-scheduler, --lr-warmup-*); mixing them is refused */
    const char *mgtrain_lr_flag = NULL, *ref_lr_flag = NULL;
    /* a flag of torchvision's references by its name there: -b differs (total here, per GPU
       there), which start-up then says; a bare --amp, whose precision follows the devices */
    const char *ref_flag = NULL;
    bool amp_auto = false, scheduler_given = false;
    long v;
    double x;
    bool ok = true;
    int opt;
    optind = 0; /* 0, not 1: glibc then also resets its permutation of a positional DIR */
    opterr = 0;
    int at = -1;
    char flag[48]; /* the flag as the user typed it ("--train-crop-size", not its alias) */
    while (ok && (at = -1, opt = getopt_long(argc, argv, ":j:a:b:p:eh", longopts, &at)) != -1) {
        if (at >= 0)
            snprintf(flag, sizeof flag, "--%s", longopts[at].name);
        else
            snprintf(flag, sizeof flag, "-%c", opt);
        static const char *const ref_names[] = {"data-path",
                                                "model",
                                                "output-dir",
                                                "test-only",
                                                "lr-scheduler",
                                                "lr-step-size",
                                                "lr-warmup-epochs",
                                                "lr-warmup-method",
                                                "lr-warmup-decay",
                                                "train-crop-size",
                                                "val-resize-size",
                                                "val-crop-size",
                                                NULL};
        for (int i = 0; at >= 0 && ref_names[i]; i++)
            if (strcmp(longopts[at].name, ref_names[i]) == 0)
                ref_flag = ref_names[i];
        switch (opt) {
        case OPT_DATA:
            c.data_dir = optarg;
            if (!*optarg) {
                fprintf(stderr, "mgtrain: --data '': an empty path (a dataset folder or pack)\n");
                ok = false;
            }
            break;
        case OPT_DUMMY: c.dummy = true; break;
        case 'j':
            ok = mgt_app_flag_int(flag, optarg, 0, 1024, &v);
            c.workers = (int)v;
            break;
        case OPT_IMAGE_SIZE:
            ok = mgt_app_flag_int(flag, optarg, 8, 4096, &v);
            c.image_size = (int)v;
            break;
        case OPT_AUGMENT:
            if (strcmp(optarg, "rrc") == 0)
                c.augment = MGT_AUGMENT_RRC;
            else if (strcmp(optarg, "pad-crop") == 0)
                c.augment = MGT_AUGMENT_PAD_CROP;
            else if (strcmp(optarg, "none") == 0)
                c.augment = MGT_AUGMENT_NONE;
            else {
                fprintf(stderr, "mgtrain: --augment '%s': expected rrc, pad-crop or none\n",
                        optarg);
                ok = false;
            }
            break;
        case OPT_MEAN:
            ok = parse_triple(flag, optarg, c.mean, false);
            c.mean_std_set = true;
            break;
        case OPT_STD:
            ok = parse_triple(flag, optarg, c.std, true);
            c.mean_std_set = true;
            break;
        case OPT_NORMALIZE:
            if (strcmp(optarg, "auto") != 0) {
                fprintf(stderr, "mgtrain: --normalize '%s': the only value is auto\n", optarg);
                ok = false;
            }
            c.normalize_auto = true;
            break;
        case OPT_STRICT: c.strict_data = true; break;
        case OPT_MAX_BAD: ok = mgt_app_flag_float(flag, optarg, 0, 1, &c.max_bad_frac); break;
        case 'a': c.arch = optarg; break;
        case OPT_PRETRAINED: c.pretrained = optarg; break;
        case OPT_ZIR: c.zero_init_residual = true; break;
        case OPT_AUX_LOGITS: ok = mgt_app_flag_onoff(flag, optarg, &c.aux_logits); break;
        case OPT_AUX_WEIGHT:
            ok = mgt_app_flag_float(flag, optarg, 0, 1e6, &x);
            c.aux_weight = (float)x;
            break;
        case OPT_TRANSFORM_INPUT: ok = mgt_app_flag_onoff(flag, optarg, &c.transform_input); break;
        case OPT_EPOCHS:
            ok = mgt_app_flag_int(flag, optarg, 1, 100000, &v);
            c.epochs = (int)v;
            break;
        case OPT_START_EPOCH:
            ok = mgt_app_flag_int(flag, optarg, 0, 100000, &v);
            c.start_epoch = (int)v;
            break;
        case 'b':
            ok = mgt_app_flag_int(flag, optarg, 1, 1 << 24, &v);
            c.batch_size = (int)v;
            break;
        case OPT_LR:
            ok = mgt_app_flag_float(flag, optarg, 0, 1e6, &x);
            c.lr.lr = (float)x;
            break;
        case OPT_MOMENTUM:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.momentum = (float)x;
            break;
        case OPT_WD:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.weight_decay = (float)x;
            break;
        case OPT_NESTEROV: c.nesterov = true; break;
        case OPT_OPT:
            if (mgt_opt_kind_parse(optarg, &c.opt) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_CLIP:
            ok = mgt_app_flag_float(flag, optarg, 0, 1e12, &x);
            c.clip_grad_norm = (float)x;
            break;
        case OPT_ACCUM:
            ok = mgt_app_flag_int(flag, optarg, 1, 1 << 20, &v);
            c.accum_steps = (int)v;
            break;
        case OPT_EMA: c.model_ema = true; break;
        case OPT_EMA_DECAY:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.model_ema_decay = (float)x;
            break;
        case OPT_EMA_STEPS:
            ok = mgt_app_flag_int(flag, optarg, 1, 1 << 30, &v);
            c.model_ema_steps = (int)v;
            break;
        case OPT_NORM_WD:
        case OPT_BIAS_WD:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            *(opt == OPT_NORM_WD ? &c.norm_weight_decay : &c.bias_weight_decay) = (float)x;
            break;
        case OPT_EMBED_WD:
            ok = mgt_app_flag_float("--transformer-embedding-decay", optarg, 0, 1, &x);
            c.transformer_embedding_decay = (float)x;
            break;
        case OPT_RA_MAGNITUDE:
            ok = mgt_app_flag_int("--ra-magnitude", optarg, 0, 30, &v);
            c.ra_magnitude = (int)v;
            break;
        case OPT_RA_SAMPLER: c.ra_sampler = true; break;
        case OPT_RA_REPS:
            ok = mgt_app_flag_int("--ra-reps", optarg, 1, 1000, &v);
            c.ra_reps = (int)v;
            break;
        case OPT_LR_SCHEDULER:
            ref_lr_flag = "--lr-scheduler";
            scheduler_given = true;
            if (mgt_lr_scheduler_parse(optarg, &c.lr.kind) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_LR_WARMUP_METHOD:
            ref_lr_flag = "--lr-warmup-method";
            if (mgt_lr_warmup_parse(optarg, &c.lr.warmup_method) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_LR_WARMUP_EPOCHS:
            ref_lr_flag = "--lr-warmup-epochs";
            ok = mgt_app_flag_int(flag, optarg, 0, 100000, &v);
            c.lr.warmup_epochs = (float)v;
            break;
        case OPT_LR_WARMUP_DECAY:
            ref_lr_flag = "--lr-warmup-decay";
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.lr.warmup_decay = (float)x;
            break;
        case OPT_LR_MIN:
            ok = mgt_app_flag_float(flag, optarg, 0, 1e6, &x);
            c.lr.lr_min = (float)x;
            break;
        case OPT_SCHEDULE:
            mgtrain_lr_flag = "--lr-schedule";
            if (mgt_lr_kind_parse(optarg, &c.lr.kind) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_LR_STEP:
            ok = mgt_app_flag_int(flag, optarg, 1, 100000, &v);
            c.lr.step_epochs = (int)v;
            break;
        case OPT_LR_GAMMA:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.lr.gamma = (float)x;
            break;
        case OPT_WARMUP:
            mgtrain_lr_flag = "--warmup-epochs";
            ok = mgt_app_flag_float(flag, optarg, 0, 100000, &x);
            c.lr.warmup_epochs = (float)x;
            break;
        case OPT_FREEZE_BN: c.freeze_bn = true; break;
        case OPT_SYNC_BN: c.sync_bn = true; break;
        case OPT_AMP:
            /* `--amp bf16`, `--amp=fp16`, or the references' bare --amp (autocast as each
               device kind does it: fp16 on CUDA, bf16 on CPU mock devices) */
            if (!optarg && optind < argc && is_amp_word(argv[optind]))
                optarg = argv[optind++];
            if (!optarg || strcmp(optarg, "auto") == 0) {
                amp_auto = true;
                ref_flag = ref_flag ? ref_flag : "amp";
            } else if (strcmp(optarg, "off") == 0 || strcmp(optarg, "f32") == 0 ||
                       strcmp(optarg, "fp32") == 0) {
                c.amp = MGT_PREC_F32;
                amp_auto = false;
            } else {
                ok = mgt_app_flag_precision(flag, optarg, true, &c.amp);
                if (!ok)
                    fprintf(stderr, "mgtrain: --amp takes bf16, fp16, off, or no value (see "
                                    "mgtrain train --help)\n");
            }
            break;
        case OPT_GRAD_DTYPE: ok = mgt_app_flag_precision(flag, optarg, false, &c.grad_dtype); break;
        case OPT_EXACT_DECODE: c.exact_decode = true; break;
        case OPT_VAL_RESIZE:
            ok = mgt_app_flag_int(flag, optarg, 1, 65536, &v);
            c.val_resize_size = (int)v;
            break;
        case OPT_VAL_CROP:
            ok = mgt_app_flag_int(flag, optarg, 8, 4096, &v);
            c.val_crop_size = (int)v;
            break;
        case OPT_KEEP_LAST:
            ok = mgt_app_flag_int("--keep-last", optarg, 1, 1000000, &v);
            c.keep_last = (int)v;
            break;
        case OPT_OVERWRITE: c.overwrite = true; break;
        case OPT_PER_CLASS: c.per_class = true; break;
        case OPT_CONFUSION: c.confusion_path = optarg; break;
        case OPT_AUGMIX_SEVERITY:
            ok = mgt_app_flag_int("--augmix-severity", optarg, 1, 10, &v);
            c.augmix_severity = (int)v;
            break;
        case OPT_INTERP:
            c.interpolation_set = true;
            /* fall through */
        case OPT_AUTO_AUGMENT:
            if ((opt == OPT_INTERP ? mgt_interp_parse(optarg, &c.interpolation)
                                   : mgt_auto_augment_parse(optarg, &c.auto_augment)) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_RANDOM_ERASE:
            ok = mgt_app_flag_float(flag, optarg, 0, 1, &x);
            c.random_erase = (float)x;
            break;
        case OPT_MIXUP:
        case OPT_CUTMIX:
            ok = mgt_app_flag_float(flag, optarg, 0, 1000, &x);
            *(opt == OPT_MIXUP ? &c.mixup_alpha : &c.cutmix_alpha) = (float)x;
            break;
        case OPT_SMOOTHING:
            ok = mgt_app_flag_float(flag, optarg, 0, 0.999, &x);
            c.label_smoothing = (float)x;
            break;
        case OPT_SEED:
            ok = mgt_app_flag_int(flag, optarg, 0, 0x7fffffffL, &v);
            c.seed = (uint64_t)v;
            break;
        case OPT_GPUS:
            gpus = optarg;
            if (!*optarg) { /* was taken as every device */
                fprintf(stderr, "mgtrain: --gpus '': an empty list (device ids such as 0,1; "
                                "leave --gpus out for every device)\n");
                ok = false;
            }
            break;
        case OPT_DEVICE:
            if (mgt_app_parse_device_kind(optarg, &kind) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_MOCK: mock = optarg; break;
        case OPT_BUCKET:
            ok = mgt_app_flag_float(flag, optarg, 0.001, 4096, &x);
            c.bucket_bytes = (size_t)(x * 1024 * 1024);
            break;
        case OPT_ALLREDUCE:
            if (mgt_allreduce_algo_parse(optarg, &c.allreduce) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case OPT_NODE_EXCHANGE:
            if (mgt_node_exchange_parse(optarg, &c.node_exchange) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case 'p':
            ok = mgt_app_flag_int(flag, optarg, 1, 1 << 30, &v);
            c.print_freq = (int)v;
            break;
        case 'e': c.evaluate = true; break;
        case OPT_RESUME: c.resume = optarg; break;
        case OPT_CKPT: c.checkpoint_dir = optarg; break;
        case OPT_LOG: c.log_path = optarg; break;
        case OPT_TENSORBOARD:
            c.tensorboard_dir = optarg;
            ctl.profile = true; /* the step per device, for TensorBoard */
            break;
        case OPT_TIME_LIMIT: ok = mgt_app_flag_float(flag, optarg, 0, 1e9, &c.time_limit_s); break;
        case OPT_TIMEOUT: ok = mgt_app_flag_float(flag, optarg, 0, 1e9, &c.step_timeout_s); break;
        case OPT_ON_DEVICE_FAILURE:
            ok = strcmp(optarg, "abort") == 0 || strcmp(optarg, "continue") == 0;
            if (!ok)
                fprintf(stderr, "mgtrain: %s '%s': expected abort or continue\n", flag, optarg);
            c.continue_on_device_failure = strcmp(optarg, "continue") == 0;
            break;
        case OPT_MIN_DEVICES:
            ok = mgt_app_flag_int(flag, optarg, 1, MGT_MAX_DEVICES, &v);
            c.min_devices = (int)v;
            break;
        case OPT_DEVICE_TIMEOUT:
            ok = mgt_app_flag_float(flag, optarg, 0.001, 1e9, &c.device_timeout_s);
            break;
        case OPT_MAX_STEPS: ok = mgt_app_flag_int(flag, optarg, 1, 1L << 40, &ctl.max_steps); break;
        case OPT_DUMMY_STEPS:
            ok = mgt_app_flag_int(flag, optarg, 1, 1L << 30, &v);
            c.dummy_steps = (int)v;
            break;
        case 'h': train_usage(stdout); return 0;
        default:
            if (opt != ':' && mgt_app_device_switch(opt, &sw))
                break;
            mgt_app_bad_option("train", opt, argv);
            ok = false;
        }
    }
    if (!ok)
        return 2;
    if (mgtrain_lr_flag && ref_lr_flag) {
        fprintf(stderr,
                "mgtrain: %s is mgtrain's per-step schedule, %s the references' per-epoch one: "
                "use one family (--lr-scheduler with --lr-warmup-*, or --lr-schedule with "
                "--warmup-epochs)\n",
                mgtrain_lr_flag, ref_lr_flag);
        return 2;
    }
    /* --lr-warmup-* without --lr-scheduler: the references' default scheduler, steplr */
    if (ref_lr_flag && !scheduler_given)
        c.lr.kind = MGT_LR_STEPLR;
    if (mgt_lr_per_epoch(c.lr.kind) && c.lr.warmup_method == MGT_LR_WARMUP_PER_STEP)
        c.lr.warmup_method = MGT_LR_WARMUP_CONSTANT; /* the references' default */
    if (!check_flags(&c, argc, argv))
        return 2;
    /* under mpirun or srun: this process is one node of the run */
    mgt_world *world;
    mgt_status st = mgt_world_open(&world);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
        return 1;
    }
    mgt_devset *set;
    /* several nodes: a lost device ends the run whatever the mode (docs/failures.md) */
    sw.recoverable = c.continue_on_device_failure && mgt_world_size(world) == 1;
    mgt_app_devices devs = {.kind = kind, .gpus = gpus, .mock = mock, .sw = sw};
    st = mgt_app_open_devices(&devs, 0, &set);
    if (st != MGT_OK) {
        train_fail_line(world, mgt_error_last(), false);
        mgt_world_close(world, true);
        return mgt_app_device_exit(st);
    }
    int replicas = mgt_devset_count(set) * mgt_world_size(world);
    bool cuda = mgt_devset_kind(set) == MGT_DEVICE_CUDA;
    if (amp_auto) /* as the references' autocast: torch.cuda.amp's fp16, CPU autocast's bf16 */
        c.amp = cuda ? MGT_PREC_FP16 : MGT_PREC_BF16;
    if (amp_auto && mgt_world_rank(world) == 0)
        printf("=> --amp: %s on these %s devices (as torch.cuda.amp on GPUs, with loss scaling; "
               "bf16 as torch.autocast on CPU mock devices); --amp bf16 or fp16 chooses\n",
               cuda ? "fp16" : "bf16", cuda ? "CUDA" : "mock");
    if (ref_flag && mgt_world_rank(world) == 0 && !c.evaluate)
        printf("=> -b %d is the total batch over all %d devices here (%d each); torchvision's "
               "references (--%s) take -b per GPU: their -b %d on %d GPUs is -b %d here\n",
               c.batch_size, replicas, c.batch_size / (replicas ? replicas : 1), ref_flag,
               c.batch_size / (replicas ? replicas : 1), replicas,
               c.batch_size / (replicas ? replicas : 1) * replicas);
    if (c.batch_size < replicas) {
        fprintf(stderr,
                "mgtrain: -b %d is smaller than the device count %d: -b is the total "
                "batch over all devices%s\n",
                c.batch_size, replicas, mgt_world_size(world) > 1 ? " of all nodes" : "");
        mgt_devset_free(set);
        mgt_world_close(world, true);
        return 2;
    }
    /* --mock xlink: the modelled link between nodes, which the exchange is chosen on */
    mgt_world_set_link(world, devs.mock_opts.xlink_bytes_per_s, devs.mock_opts.xlink_latency_s);
    ctl.world = world;
    ctl.command_line = mgt_app_command_line();
    FILE *quiet = NULL;
    if (mgt_world_rank(world) != 0) { /* node 0 speaks for the world */
        quiet = fopen("/dev/null", "w");
        ctl.out = quiet;
    }
    atomic_store(&stop_requested, 0);
    ctl.stop = &stop_requested;
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    mgt_train_result res;
    st = mgt_train_run(&c, &ctl, set, &res);
    mgt_train_result_free(&res);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    /* the run's line, before closing the devices (which may set a text of their own) */
    char why[1024];
    snprintf(why, sizeof why, "%s", mgt_error_last());
    mgt_devset_free(set);
    if (quiet)
        fclose(quiet);
    if (st != MGT_OK) {
        train_fail_line(world, why, res.remote_failure);
        mgt_world_close(world, true);
        return st == MGT_ERR_USAGE ? 2 : 1;
    }
    mgt_world_close(world, false);
    /* a signal's stop ends as a program stopped by it does; a time limit is a planned stop */
    int sig = atomic_load(&stop_requested);
    return res.interrupted && sig ? 128 + sig : 0;
}
