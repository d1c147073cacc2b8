/* `mgtrain export --onnx OUT.onnx (--checkpoint FILE | -a NAME --pretrained FILE)`: a trained
   model as an ONNX file for ONNX Runtime, TensorRT and the rest (mgt_model_export_onnx), with
   its class names, input size and normalisation in the model's metadata. The model is built
   on one CPU mock device: export needs no GPU. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "app/commands.h"
#include "mgt/data.h"
#include "mgt/nn.h"
#include "mgt/train.h"
#include "mgt/version.h"

static void export_usage(FILE *f)
{
    fprintf(
        f, "usage: mgtrain export --onnx OUT.onnx --checkpoint FILE [OPTIONS]\n"
           "       mgtrain export --onnx OUT.onnx -a NAME --pretrained FILE [OPTIONS]\n"
           "\n"
           "Writes the model's inference graph as ONNX (opset 17): batch norm as\n"
           "BatchNormalization, dropout and stochastic depth removed, the weights under their\n"
           "torchvision names. Input \"input\": float32 [batch, C, H, W], the images normalised\n"
           "as in training ((pixel / 255 - mean) / std), batch dynamic, H and W the model's size.\n"
           "Output \"logits\": float32 [batch, classes], before softmax. The metadata holds the\n"
           "architecture, class names, input size, mean and std.\n"
           "\n"
           "  --onnx OUT.onnx        the file to write (through a temporary file and a rename)\n"
           "  --checkpoint FILE      an mgtrain checkpoint: architecture, classes, channels and\n"
           "                         size from its metadata\n"
           "  -a, --arch NAME        with --pretrained: the architecture of torchvision-named\n"
           "  --pretrained FILE      weights (safetensors)\n"
           "  --classes K            with --pretrained: classifier outputs (the architecture's\n"
           "                         default: 1000, or 10 for the CIFAR networks)\n"
           "  --in-channels C        with --pretrained: 1 or 3 (3)\n"
           "  --image-size S         the input side (the checkpoint's, else the architecture's)\n"
           "  --ema                  the checkpoint's EMA model (model_ema.*) instead\n"
           "  --data DIR             class names from this dataset (a tree or a pack); without\n"
           "                         it: the checkpoint's, else class_0 ... class_K-1\n"
           "  --mean M,M,M --std S,S,S  the normalisation the model was trained with, for the\n"
           "                         metadata (default: training's, ImageNet's 0.485,0.456,0.406\n"
           "                         and 0.229,0.224,0.225; 0.459 and 0.2256 for 1 channel)\n");
}

static bool parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    long v;
    if (!mgt_app_flag_int(flag, s, lo, hi, &v))
        return false;
    *out = (int)v;
    return true;
}

/* "a,b,c" (or one value for every channel) into v[3] */
static bool parse_triple(const char *flag, const char *s, float v[3])
{
    float t[3];
    char extra;
    int n = sscanf(s, "%f,%f,%f%c", &t[0], &t[1], &t[2], &extra);
    if (n == 1) {
        t[1] = t[2] = t[0];
    } else if (n != 3) {
        fprintf(stderr, "mgtrain export: %s '%s': expected three numbers, as 0.5,0.5,0.5\n", flag,
                s);
        return false;
    }
    memcpy(v, t, sizeof t);
    return true;
}

/* A whole number from the checkpoint's metadata, or -1 when absent. */
static int meta_int(const mgt_st_file *f, const char *key)
{
    const char *v = mgt_st_metadata_get(f, key);
    char *end;
    long x = v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && x > 0 && x < 1000000 ? (int)x : -1;
}

/* The tensors of the EMA model, renamed: model_ema.NAME becomes NAME (the file is rewritten to
   a temporary safetensors file the model then loads). */
static mgt_status ema_file(const mgt_st_file *f, const char *tmp)
{
    mgt_st_writer *w = NULL;
    mgt_status st = mgt_st_writer_create(&w);
    int found = 0;
    for (int i = 0; st == MGT_OK && i < mgt_st_count(f); i++) {
        const char *name = mgt_st_tensor_name(f, i);
        if (strncmp(name, "model_ema.", 10) != 0 || strcmp(name, "model_ema.n_averaged") == 0)
            continue;
        st = mgt_st_writer_add(w, name + 10, mgt_st_tensor_dtype(f, i), mgt_st_tensor_ndim(f, i),
                               mgt_st_tensor_shape(f, i), mgt_st_tensor_data(f, i));
        found++;
    }
    if (st == MGT_OK && !found)
        st = mgt_error_set(MGT_ERR_INVALID, "--ema: the checkpoint holds no EMA model "
                                            "(model_ema.*: trained without --model-ema?)");
    if (st == MGT_OK)
        st = mgt_st_writer_save(w, tmp);
    mgt_st_writer_free(w);
    return st;
}

int mgt_app_cmd_export(int argc, char **argv)
{
    enum { O_ONNX = 256, O_CKPT, O_PRE, O_CLASSES, O_CH, O_SIZE, O_EMA, O_DATA, O_MEAN, O_STD };
    static const struct option opts[] = {{"onnx", required_argument, NULL, O_ONNX},
                                         {"checkpoint", required_argument, NULL, O_CKPT},
                                         {"arch", required_argument, NULL, 'a'},
                                         {"pretrained", required_argument, NULL, O_PRE},
                                         {"classes", required_argument, NULL, O_CLASSES},
                                         {"in-channels", required_argument, NULL, O_CH},
                                         {"image-size", required_argument, NULL, O_SIZE},
                                         {"ema", no_argument, NULL, O_EMA},
                                         {"data", required_argument, NULL, O_DATA},
                                         {"mean", required_argument, NULL, O_MEAN},
                                         {"std", required_argument, NULL, O_STD},
                                         {"help", no_argument, NULL, 'h'},
                                         {0, 0, 0, 0}};
    const char *out = NULL, *ckpt = NULL, *arch = NULL, *pre = NULL, *data = NULL;
    int classes = -1, channels = -1, size = -1;
    bool ema = false;
    float mean[3] = {0}, std[3] = {0};
    bool mean_set = false, std_set = false;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, ":a:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (ch) {
        case O_ONNX: out = optarg; break;
        case O_CKPT: ckpt = optarg; break;
        case 'a': arch = optarg; break;
        case O_PRE: pre = optarg; break;
        case O_CLASSES: ok = parse_int("--classes", optarg, 1, 1000000, &classes); break;
        case O_CH: ok = parse_int("--in-channels", optarg, 1, 4, &channels); break;
        case O_SIZE: ok = parse_int("--image-size", optarg, 1, 4096, &size); break;
        case O_EMA: ema = true; break;
        case O_DATA: data = optarg; break;
        case O_MEAN: ok = mean_set = parse_triple("--mean", optarg, mean); break;
        case O_STD: ok = std_set = parse_triple("--std", optarg, std); break;
        case 'h': export_usage(stdout); return 0;
        default: return mgt_app_bad_option("export", ch, argv);
        }
        if (!ok)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "mgtrain export: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "mgtrain export: --onnx OUT.onnx is needed (the only format so far)\n");
        return 2;
    }
    if (!!ckpt == !!pre) {
        fprintf(stderr, "mgtrain export: give either --checkpoint FILE or -a NAME --pretrained "
                        "FILE\n");
        return 2;
    }
    if (pre && !arch) {
        fprintf(stderr, "mgtrain export: --pretrained needs -a NAME (the weights' "
                        "architecture)\n");
        return 2;
    }
    if (ckpt && (arch || classes > 0 || channels > 0)) {
        fprintf(stderr, "mgtrain export: --checkpoint FILE gives the architecture, classes and "
                        "channels: -a, --classes and --in-channels go with --pretrained\n");
        return 2;
    }
    if (ema && !ckpt) {
        fprintf(stderr, "mgtrain export: --ema needs --checkpoint\n");
        return 2;
    }
    const char *src = ckpt ? ckpt : pre;
    mgt_st_file *f = NULL;
    mgt_status st = mgt_st_open(src, &f);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain export: %s: %s\n", ckpt ? "--checkpoint" : "--pretrained",
                mgt_error_last());
        return 1;
    }
    char arch_buf[64] = "";
    if (ckpt) {
        const char *a = mgt_st_metadata_get(f, "arch");
        classes = meta_int(f, "classes");
        channels = meta_int(f, "in_channels");
        if (size < 0)
            size = meta_int(f, "image_size");
        if (!a || classes < 0 || channels < 0 || size < 0) {
            fprintf(stderr,
                    "mgtrain export: --checkpoint %s: no arch, classes, in_channels or image_size "
                    "in its metadata (not an mgtrain checkpoint? torchvision weights go with -a "
                    "NAME --pretrained)\n",
                    src);
            mgt_st_close(f);
            return 1;
        }
        snprintf(arch_buf, sizeof arch_buf, "%s", a);
        arch = arch_buf;
    }
    const mgt_arch_info *ai = mgt_arch_find(arch);
    if (!ai) {
        fprintf(stderr, "mgtrain export: unknown architecture '%s' (mgtrain model lists them)\n",
                arch);
        mgt_st_close(f);
        return ckpt ? 1 : 2;
    }
    if (classes < 0)
        classes = ai->synthetic_classes;
    if (channels < 0)
        channels = 3;
    if (size < 0)
        size = ai->image_size ? ai->image_size : ai->synthetic_size;
    /* class names: --data, else the checkpoint's "class_names" (a JSON list), else numbered */
    char **names = calloc((size_t)classes, sizeof *names);
    int rc = 1;
    mgt_dataset *ds = NULL;
    mgt_devset *set = NULL;
    mgt_stream *s = NULL;
    mgt_model *m = NULL;
    char *names_json = NULL, tmp[4200] = "";
    const char *names_from = "numbered (no --data, none in the file)";
    if (!names)
        goto out;
    if (data) {
        if (mgt_data_open(data, NULL, &ds, NULL) != MGT_OK) {
            fprintf(stderr, "mgtrain export: --data %s\n", mgt_error_last());
            goto out;
        }
        if (mgt_dataset_class_count(ds) != classes) {
            fprintf(stderr, "mgtrain export: --data %s has %d classes, the model %d\n", data,
                    mgt_dataset_class_count(ds), classes);
            goto out;
        }
        for (int i = 0; i < classes; i++)
            names[i] = strdup(mgt_dataset_class_name(ds, i));
        names_from = data;
    } else {
        cJSON *list = cJSON_Parse(
            mgt_st_metadata_get(f, "class_names") ? mgt_st_metadata_get(f, "class_names") : "");
        if (cJSON_IsArray(list) && cJSON_GetArraySize(list) == classes) {
            for (int i = 0; i < classes; i++) {
                const char *n = cJSON_GetStringValue(cJSON_GetArrayItem(list, i));
                names[i] = strdup(n ? n : "");
            }
            names_from = "the file's metadata";
        }
        cJSON_Delete(list);
    }
    cJSON *jn = cJSON_CreateArray();
    for (int i = 0; i < classes; i++) {
        char num[32];
        snprintf(num, sizeof num, "class_%d", i);
        cJSON_AddItemToArray(jn, cJSON_CreateString(names[i] ? names[i] : num));
    }
    names_json = cJSON_PrintUnformatted(jn);
    cJSON_Delete(jn);
    /* the model on one CPU mock device */
    int id = 0;
    mgt_mock_options mo;
    if ((st = mgt_mock_options_parse(&mo, "threads=1")) == MGT_OK) {
        mgt_devset_options dopt = {.mock = &mo};
        st = mgt_devset_open(MGT_DEVICE_MOCK, &id, 1, &dopt, &set);
    }
    mgt_device *d = set ? mgt_devset_device(set, 0) : NULL;
    if (st == MGT_OK)
        st = mgt_stream_create(d, &s);
    mgt_model_config mc = {.arch = arch,
                           .classes = classes,
                           .in_channels = channels,
                           .image_size = size,
                           .batch = 1,
                           .no_fusion = true};
    if (st == MGT_OK)
        st = mgt_model_create(&mc, d, &m);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain export: %s\n", mgt_error_last());
        goto out;
    }
    const char *weights = src;
    if (ema) {
        snprintf(tmp, sizeof tmp, "%s.ema.tmp", out);
        if ((st = ema_file(f, tmp)) != MGT_OK) {
            fprintf(stderr, "mgtrain export: --checkpoint %s: %s\n", src, mgt_error_last());
            goto out;
        }
        weights = tmp;
    }
    static const char *const ignore[] = {"optimizer.", "model_ema.", NULL};
    mgt_model_load_options lo = {.ignore_prefixes = ignore};
    mgt_model_load_report rep = {0};
    st = mgt_model_load_safetensors(m, s, weights, &lo, &rep);
    free(rep.text);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain export: %s: %s\n", ckpt ? "--checkpoint" : "--pretrained",
                mgt_error_last());
        goto out;
    }
    char nums[4][96];
    snprintf(nums[0], sizeof nums[0], "%d", classes);
    snprintf(nums[1], sizeof nums[1], "[%d, %d, %d]", channels, size, size);
    /* the checkpoint's normalisation (every checkpoint says it), else training's default
       (mgt_transform_init): ImageNet's, its grey for 1 channel */
    mgt_ckpt_info info = {0};
    bool have_info = mgt_ckpt_info_read(f, src, &info) == MGT_OK;
    for (int c = 0; c < 3; c++) {
        if (!mean_set)
            mean[c] = have_info && info.has_norm ? info.mean[c]
                      : channels == 1            ? 0.4590f
                                                 : mgt_imagenet_mean[c];
        if (!std_set)
            std[c] = have_info && info.has_norm ? info.std[c]
                     : channels == 1            ? 0.2256f
                                                : mgt_imagenet_std[c];
    }
    if (have_info)
        mgt_ckpt_info_free(&info);
    /* one value per input channel, as the training transform takes them */
    for (int k = 2; k < 4; k++) {
        const float *v = k == 2 ? mean : std;
        size_t o = (size_t)snprintf(nums[k], sizeof nums[k], "[");
        for (int c = 0; c < channels && c < 3 && o < sizeof nums[k]; c++)
            o += (size_t)snprintf(nums[k] + o, sizeof nums[k] - o, "%s%.7g", c ? ", " : "", v[c]);
        if (o < sizeof nums[k])
            snprintf(nums[k] + o, sizeof nums[k] - o, "]");
    }
    const char *meta[] = {"arch",        arch,
                          "family",      ai->family,
                          "classes",     nums[0],
                          "class_names", names_json ? names_json : "[]",
                          "input",       "float32 [batch, C, H, W]: (pixel / 255 - mean) / std",
                          "input_shape", nums[1],
                          "mean",        nums[2],
                          "std",         nums[3],
                          "output",      "logits: float32 [batch, classes], before softmax",
                          "source",      src,
                          "weights",     ema ? "model_ema (the EMA model)" : "model",
                          NULL};
    char doc[512];
    snprintf(doc, sizeof doc, "%s (%s), %d classes, input %dx%dx%d, exported by mgtrain %s from %s",
             arch, ai->family, classes, channels, size, size, mgt_version(), src);
    st = mgt_model_export_onnx(m, s, out, meta, doc);
    if (st != MGT_OK) {
        fprintf(stderr, "mgtrain export: --onnx %s\n", mgt_error_last());
        goto out;
    }
    printf("%s: %s%s, %d classes (names: %s), input [batch, %d, %d, %d], ONNX opset 17\n", out,
           arch, ema ? " (EMA)" : "", classes, names_from, channels, size, size);
    rc = 0;
out:
    if (tmp[0])
        remove(tmp);
    mgt_model_free(m);
    mgt_devset_free(set);
    mgt_dataset_free(ds);
    mgt_st_close(f);
    for (int i = 0; names && i < classes; i++)
        free(names[i]);
    free(names);
    free(names_json);
    return rc;
}
