/* `mgtrain predict --checkpoint FILE IMAGE|DIR...`: a trained model's top-k classes, with
   names and probabilities, for each image (mgt_predict_run), as text or JSON lines. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "app/commands.h"
#include "mgt/nn.h"
#include "mgt/train.h"

static void predict_usage(FILE *f)
{
    fprintf(
        f, "usage: mgtrain predict --checkpoint FILE [options] IMAGE|DIR...\n"
           "       mgtrain predict -a ARCH --pretrained WEIGHTS [options] IMAGE|DIR...\n"
           "\n"
           "The top classes of each image, with their names and probabilities, through the\n"
           "validation transform the model was measured with (the checkpoint's resize, crop,\n"
           "interpolation, mean and std); a folder gives every image under it, sorted.\n"
           "\n"
           "  --checkpoint FILE      an mgtrain checkpoint (model_best.safetensors, ...): its\n"
           "                         architecture, classes, names and transform\n"
           "  --pretrained FILE      torchvision weights (safetensors; scripts/pth_to_safetensors\n"
           "                         .py converts a .pth), with -a ARCH\n"
           "  -a, --arch NAME        the architecture (default: the checkpoint's)\n"
           "  --image-size S         the input side (default: the checkpoint's or the arch's)\n"
           "  --in-channels C        1 or 3 (default: the checkpoint's, else 3)\n"
           "  --class-names FILE     class names, one a line (default: the checkpoint's)\n"
           "  -k, --top-k K          classes per image (5)\n"
           "  --json                 one JSON object a line: {\"path\", \"top\": [{\"class\",\n"
           "                         \"index\", \"probability\"}]} or {\"path\", \"error\"}\n"
           "  -b, --batch-size N     images per step over all devices (32)\n"
           "  -j, --workers N        decode threads (default: one per core)\n"
           "  --amp bf16|fp16        mixed precision, as training's\n"
           "  --gpus LIST, --device auto|cuda|cpu, --mock SPEC   the devices, as "
           "training's\n" MGT_APP_SWITCH_USAGE
           "Exit status: 0 every image predicted, 1 an image or the model could not be read,\n"
           "2 a bad command line.\n");
}

int mgt_app_cmd_predict(int argc, char **argv)
{
    enum { O_CKPT = 256, O_PRE, O_SIZE, O_CH, O_NAMES, O_JSON, O_AMP, O_GPUS, O_DEVICE, O_MOCK };
    static const struct option opts[] = {{"checkpoint", required_argument, NULL, O_CKPT},
                                         {"pretrained", required_argument, NULL, O_PRE},
                                         {"arch", required_argument, NULL, 'a'},
                                         {"model", required_argument, NULL, 'a'},
                                         {"image-size", required_argument, NULL, O_SIZE},
                                         {"in-channels", required_argument, NULL, O_CH},
                                         {"class-names", required_argument, NULL, O_NAMES},
                                         {"top-k", required_argument, NULL, 'k'},
                                         {"json", no_argument, NULL, O_JSON},
                                         {"batch-size", required_argument, NULL, 'b'},
                                         {"workers", required_argument, NULL, 'j'},
                                         {"amp", required_argument, NULL, O_AMP},
                                         {"gpus", required_argument, NULL, O_GPUS},
                                         {"device", required_argument, NULL, O_DEVICE},
                                         {"mock", required_argument, NULL, O_MOCK},
                                         MGT_APP_SWITCH_LONGOPTS,
                                         {"help", no_argument, NULL, 'h'},
                                         {0, 0, 0, 0}};
    mgt_predict_config c;
    mgt_predict_config_defaults(&c);
    c.out = stdout;
    const char *ckpt = NULL, *pre = NULL;
    mgt_app_devices devs = {0};
    long v;
    bool ok = true;
    int ch;
    optind = 1;
    opterr = 0;
    while (ok && (ch = getopt_long(argc, argv, ":a:k:b:j:h", opts, NULL)) != -1) {
        switch (ch) {
        case O_CKPT: ckpt = optarg; break;
        case O_PRE: pre = optarg; break;
        case 'a': c.arch = optarg; break;
        case O_SIZE:
            ok = mgt_app_flag_int("--image-size", optarg, 8, 4096, &v);
            c.image_size = (int)v;
            break;
        case O_CH:
            ok = mgt_app_flag_int("--in-channels", optarg, 1, 3, &v) && v != 2;
            if (v == 2)
                fprintf(stderr, "mgtrain: --in-channels 2: images have 1 or 3\n");
            c.in_channels = (int)v;
            break;
        case O_NAMES: c.class_names = optarg; break;
        case 'k':
            ok = mgt_app_flag_int("--top-k", optarg, 1, MGT_PREDICT_MAX_K, &v);
            c.top_k = (int)v;
            break;
        case O_JSON: c.json = true; break;
        case 'b':
            ok = mgt_app_flag_int("--batch-size", optarg, 1, 1 << 16, &v);
            c.batch_size = (int)v;
            break;
        case 'j':
            ok = mgt_app_flag_int("--workers", optarg, 0, 1024, &v);
            c.workers = (int)v;
            break;
        case O_AMP: ok = mgt_app_flag_precision("--amp", optarg, true, &c.amp); break;
        case O_GPUS: devs.gpus = optarg; break;
        case O_DEVICE:
            if (mgt_app_parse_device_kind(optarg, &devs.kind) != MGT_OK) {
                fprintf(stderr, "mgtrain: %s\n", mgt_error_last());
                ok = false;
            }
            break;
        case O_MOCK: devs.mock = optarg; break;
        case 'h': predict_usage(stdout); return 0;
        default:
            if (ch != ':' && mgt_app_device_switch(ch, &devs.sw))
                break;
            return mgt_app_bad_option("predict", ch, argv);
        }
    }
    if (!ok)
        return 2;
    if (!ckpt == !pre) {
        fprintf(stderr,
                "mgtrain predict: give --checkpoint FILE (an mgtrain checkpoint) or "
                "--pretrained FILE with -a ARCH (torchvision weights)%s\n",
                ckpt ? ", not both" : "");
        return 2;
    }
    if (pre && !c.arch) {
        fprintf(stderr, "mgtrain predict: --pretrained %s: name its architecture with -a\n", pre);
        return 2;
    }
    if (c.arch && !mgt_arch_find(c.arch)) {
        fprintf(stderr, "mgtrain predict: -a '%s': unknown architecture; the %d known:\n", c.arch,
                mgt_app_arch_count());
        mgt_app_print_archs(stderr);
        return 2;
    }
    if (optind >= argc) {
        fprintf(stderr, "mgtrain predict: no image or folder given\n");
        return 2;
    }
    c.weights = ckpt ? ckpt : pre;
    c.inputs = (const char *const *)argv + optind;
    c.n_inputs = argc - optind;
    mgt_devset *set;
    mgt_status st = mgt_app_open_devices(&devs, 0, &set);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain predict: %s\n", mgt_error_last());
        return mgt_app_device_exit(st);
    }
    mgt_predict_result res;
    st = mgt_predict_run(&c, set, &res);
    char why[1024];
    snprintf(why, sizeof why, "%s", mgt_error_last());
    mgt_devset_free(set);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain predict: %s\n", why); /* it names the file */
        return st == MGT_ERR_USAGE ? 2 : 1;
    }
    if (res.failed)
        fprintf(stderr, "mgtrain predict: %zu of %zu images could not be read\n", res.failed,
                res.images);
    return res.failed ? 1 : 0;
}
