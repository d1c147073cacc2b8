/* The data pipeline: ImageFolder scan, packs, image decoding, torchvision-equivalent
 * transforms and the references recipe's augmentations, DistributedSampler, the prefetching
 * loader (with mixup and cutmix), and the Fashion-MNIST IDX import.
 *
 * Order of things in a run: mgt_data_open (a tree or a pack) -> mgt_transform_init ->
 * mgt_loader_create (one loader per split, shared by all devices) -> per epoch
 * mgt_loader_set_epoch, then each device's thread calls mgt_loader_next once per step.
 *
 * Randomness: a sample's crop, flip, policy ops and erasing come from the Philox stream keyed
 * by (seed, epoch, dataset index, MGT_RNG_AUGMENT); its mixing (partner, choice, lambda, box)
 * from (seed, epoch, its place in the epoch's order, MGT_RNG_MIX); an epoch's order from
 * (seed + epoch, MGT_RNG_SHUFFLE). Nothing depends on thread timing or on the device count,
 * except which device a sample lands on. (So the few samples that PAD repeats at an epoch's
 * end get the same crop twice, where PyTorch would draw two.)
 */
#ifndef MGT_DATA_H
#define MGT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mgt/device.h"
#include "mgt/rng.h"
#include "mgt/status.h"
#include "mgt/thread.h"

/* Limits on untrusted images: stb rejects a side over MGT_IMAGE_MAX_SIDE, we reject more
   pixels than MGT_IMAGE_MAX_PIXELS (PIL's decompression-bomb threshold) before decoding. */
#define MGT_IMAGE_MAX_SIDE 32768
#define MGT_IMAGE_MAX_PIXELS 89478485L

/* ---- ImageFolder ---- */

/* One split (DIR/train or DIR/val) as torchvision's ImageFolder sees it: classes are the
   immediate subfolders sorted by strcmp (Python's sorted), label = position; a class's files
   are found recursively (symlinks followed, as os.walk(followlinks=True)) and ordered as
   sorted(os.walk) then sorted(files). Unlike os.walk, each folder is entered once (by device
   and inode): a link back to a folder above it (a loop), to another class folder, to the
   split folder, or to a folder already entered another way is not followed, with a
   warning naming the link and where it leads; subfolders are entered in sorted order, so
   which way to a folder counts is the same on every file system.
   Files count when their extension is one of jpg jpeg png bmp gif pgm ppm tga (any case).
   Unlike torchvision, names starting with '.' (files and folders) are skipped: editors and
   notebooks leave such folders (.ipynb_checkpoints) inside class folders. */
typedef struct mgt_dataset mgt_dataset;
typedef struct mgt_pack mgt_pack;

typedef struct mgt_scan_options {
    FILE *progress;         /* where "scanning ...: N files, X files/s" goes, redrawn with \r
                           about 4 times a second; NULL: silent. Pass stderr when it is a tty. */
    const mgt_abort *abort; /* (optional) leaves a long scan with MGT_ERR_ABORTED */
    FILE *warn;             /* warnings (links not followed); NULL: stderr */
} mgt_scan_options;

/* Scans one split folder. Errors (naming the path): the folder is missing or unreadable, it
   has no class folders, or a class folder has no image file. opt may be NULL. */
mgt_status mgt_dataset_scan(const char *dir, const mgt_scan_options *opt, mgt_dataset **out);

/* Scans DIR/train and DIR/val; also an error: DIR missing, the two class lists differ (the
   message names the first class that is in one and not the other). Either out pointer may be
   NULL to skip that split (then only the other is checked). */
mgt_status mgt_imagefolder_open(const char *dir, const mgt_scan_options *opt, mgt_dataset **train,
                                mgt_dataset **val);

/* A split of loose image files (`mgtrain predict`): each path a file (taken whatever its
   extension) or a folder (every image file under it, recursively, in sorted order; names
   starting with '.' skipped; links to folders not followed), in the order given, one class
   "?", each sample's relpath the whole path. Errors name the path: missing, neither file nor
   folder, a folder without images. */
mgt_status mgt_dataset_from_paths(const char *const *paths, int n, mgt_dataset **out);

void mgt_dataset_free(mgt_dataset *ds); /* NULL is a no-op */

size_t mgt_dataset_size(const mgt_dataset *ds);
int mgt_dataset_class_count(const mgt_dataset *ds);
const char *mgt_dataset_class_name(const mgt_dataset *ds, int label); /* borrowed */
int mgt_dataset_label(const mgt_dataset *ds, size_t i);
const char *mgt_dataset_dir(const mgt_dataset *ds); /* the split folder; borrowed */
/* "class/sub/name.jpg", relative to the split folder; borrowed. */
const char *mgt_dataset_relpath(const mgt_dataset *ds, size_t i);
/* Writes "dir/class/sub/name.jpg" into buf; MGT_ERR_INVALID when cap is too small. */
mgt_status mgt_dataset_path(const mgt_dataset *ds, size_t i, char *buf, size_t cap);
/* Seconds the scan took (files/s = size / seconds). */
double mgt_dataset_scan_seconds(const mgt_dataset *ds);
/* Symbolic links to folders already entered that the scan did not follow (each warned). */
size_t mgt_dataset_links_skipped(const mgt_dataset *ds);
/* Whether two splits have the same class names in the same order. */
bool mgt_dataset_same_classes(const mgt_dataset *a, const mgt_dataset *b);

/* Looks at the headers (stbi_info) of up to `probe` files spread over the split:
   *w, *h = the most common size; *channels = 1 when every probed file is gray (with or
   without alpha), else 3. Unreadable files are passed over. MGT_ERR_INVALID when none of
   the probed files is readable. */
mgt_status mgt_dataset_probe(const mgt_dataset *ds, int probe, int *w, int *h, int *channels);

/* ---- packs ---- */

/* A pack: the splits of an ImageFolder tree in one file (format in src/data/pack.c and the
   README): an index, labels, class names and each image either kept as its JPEG, re-encoded
   as JPEG at a maximum side, or stored as raw pixels; every record with a CRC-32. Read with
   pread, the index copied when a split is opened. A file that was bad when packed is kept as a bad record holding the reason,
   and is skipped (or fatal under --strict-data) as it would be in the folder. */
typedef enum mgt_pack_format {
    MGT_PACK_JPEG, /* JPEGs that fit the maximum side as they are; the rest re-encoded */
    MGT_PACK_RAW,  /* 8-bit pixels (for small images: Fashion-MNIST's 784 bytes) */
} mgt_pack_format;

typedef struct mgt_pack_options {
    mgt_pack_format format;
    int max_side; /* the longer side at most this (resized as Resize would); 0: as they are */
    int quality;  /* JPEG quality of re-encoded images (90) */
    int workers;  /* threads (0: cores) */
    FILE *progress;
    const mgt_abort *abort;
    void (*bad)(void *ctx, const char *reason); /* each bad file, in index order */
    void *bad_ctx;
} mgt_pack_options;

typedef struct mgt_pack_stats {
    size_t records, bad, reencoded;
    uint64_t bytes_in_records, file_bytes;
} mgt_pack_stats;

/* Writes the splits (their names: "train", "val"; at most 15 characters) into out_path
   atomically (a temp file beside it, fsync, rename, fsync of the folder): on any error the
   temp file is removed and an existing out_path is left as it was. The same folders and
   options give the same bytes. */
mgt_status mgt_pack_write(const mgt_pack_options *o, const mgt_dataset *const *splits,
                          const char *const *names, int nsplits, const char *out_path,
                          mgt_pack_stats *stats);

/* One split of a pack file as a dataset. Errors name the file and what is wrong with it
   (not a pack, another version, a checksum or an offset that does not hold, no such
   split). */
mgt_status mgt_pack_open(const char *path, const char *split, mgt_dataset **out);

/* Whether path is a readable pack holding a split of that name. */
bool mgt_pack_has_split(const char *path, const char *split);

/* Whether ds is read from a pack. */
bool mgt_dataset_is_pack(const mgt_dataset *ds);

/* What `--data PATH` names: a pack file (its train and val splits), a folder holding
   train.pack and val.pack, or an ImageFolder tree (mgt_imagefolder_open). Either out
   pointer may be NULL to skip that split. The classes of the two splits must agree. */
mgt_status mgt_data_open(const char *path, const mgt_scan_options *opt, mgt_dataset **train,
                         mgt_dataset **val);

/* ---- images ---- */

/* A decoded image: h rows of w pixels of c interleaved 8-bit channels. */
typedef struct mgt_image {
    uint8_t *pixels; /* owned; release with mgt_image_release */
    int w, h, c;
} mgt_image;

/* Decodes an image file's bytes into `channels` (1 or 3) channels, whole and at full size,
   with the pixels torchvision's loader (PIL's open + convert) gets. JPEG is decoded by
   libjpeg-turbo with PIL's settings (PIL links the same library): bit-identical, CMYK and
   YCCK included (PIL's inverted-CMYK reading and its cmyk2rgb). PNG, BMP, GIF, TGA and PNM
   by stb_image, with PIL's layout rules: gray -> RGB repeats it; alpha is dropped (not
   composited); palette images are expanded; 16-bit PNGs keep the high byte; GIFs give
   their first frame. RGB -> gray is PIL's L = R*299/1000 + G*587/1000 + B*114/1000,
   computed as PIL does (weights 19595/38470/7471 of 65536, rounded), so bit-exact with
   PIL. `name` is used in error messages (the path). Errors: MGT_ERR_INVALID with
   "name: reason" (the decoder's reason, a truncated JPEG, too large). */
mgt_status mgt_image_decode(const void *bytes, size_t len, const char *name, int channels,
                            mgt_image *out);

/* Reads and decodes a file (MGT_ERR_IO when it cannot be read). */
mgt_status mgt_image_load(const char *path, int channels, mgt_image *out);

/* Frees the pixels and zeroes *img; safe on a zeroed image. */
void mgt_image_release(mgt_image *img);

/* ---- decoders: one per thread, reusing their buffers ---- */

/* What a file's header says. */
typedef struct mgt_image_header {
    int w, h;
    int c;     /* 1: gray (with or without alpha), 3: colour */
    bool jpeg; /* decoded by libjpeg-turbo (else stb_image) */
    bool cmyk; /* a CMYK or YCCK JPEG */
} mgt_image_header;

/* The part of an image a transform needs. A JPEG is decoded at 1/scale of its size by
   libjpeg-turbo's scaled IDCT, and only as far as the rectangle [x0, x1) x [y0, y1) of the
   scaled image needs: rows above it are skipped (jpeg_skip_scanlines: no IDCT, no colour
   conversion), columns outside it cropped (jpeg_crop_scanline, to the iMCU), and decoding
   stops after row y1. Other formats are decoded whole at full scale. */
typedef struct mgt_decode_region {
    int scale; /* 1, 2, 4 or 8 */
    int x0, y0, x1, y1;
} mgt_decode_region;

/* Decoded pixels, borrowed from the decoder until its next call: rows y0 .. y0+h-1 and
   columns x0 .. x0+w-1 of an image of full_w x full_h (the size at 1/scale), c channels,
   `stride` bytes from one row to the next. */
typedef struct mgt_image_view {
    const uint8_t *px;
    size_t stride;
    int x0, y0, w, h;
    int full_w, full_h;
    int c;
    int scale;
} mgt_image_view;

/* What a decoder has done: `growths` counts the times one of its buffers had to grow (the
   pixel buffer, the stb_image arena), so that a steady state shows 0 new growths. (libjpeg
   itself takes its per-image work memory from malloc inside the library, freed when the
   image is done; that is not ours to reuse.) */
typedef struct mgt_decoder_stats {
    uint64_t growths;
    uint64_t jpeg_whole;  /* whole JPEGs at full scale (TurboJPEG) */
    uint64_t jpeg_region; /* region decodes (libjpeg API) */
    uint64_t jpeg_scaled; /* of those, at a DCT scale below 1 */
    uint64_t stb;         /* other formats */
} mgt_decoder_stats;

typedef struct mgt_decoder mgt_decoder;

mgt_status mgt_decoder_create(mgt_decoder **out);
void mgt_decoder_free(mgt_decoder *d); /* NULL is a no-op */
const mgt_decoder_stats *mgt_decoder_stats_get(const mgt_decoder *d);

/* The header of a whole file's bytes (errors as mgt_image_decode's: empty, unknown format,
   truncated JPEG, too many pixels). */
mgt_status mgt_decoder_header(mgt_decoder *d, const void *bytes, size_t len, const char *name,
                              mgt_image_header *out);

/* Decodes into the decoder's buffer. hd: the header from mgt_decoder_header (NULL: read it
   here). region NULL: the whole image at full scale with mgt_image_decode's pixels
   (torchvision's). With a region, a JPEG's pixels inside it equal the whole decode's at
   scale 1, except that a gray result from a colour JPEG is the file's luma, not PIL's L
   of the decoded RGB (the tests allow 8 levels: they differ where a colour clips); at scale 1/2..1/8 they are libjpeg's
   scaled IDCT. */
mgt_status mgt_decoder_decode(mgt_decoder *d, const void *bytes, size_t len, const char *name,
                              int channels, const mgt_image_header *hd,
                              const mgt_decode_region *region, mgt_image_view *out);

/* ---- transforms ---- */

typedef enum mgt_transform_kind {
    /* RandomResizedCrop(size, scale, ratio, bilinear, antialias) [+ RandomHorizontalFlip]:
       ImageNet training. */
    MGT_TRANSFORM_RRC,
    /* RandomCrop(size, padding, fill 0) [+ RandomHorizontalFlip]: CIFAR-style training. */
    MGT_TRANSFORM_PAD_CROP,
    /* Resize(resize, bilinear, antialias) + CenterCrop(size): evaluation. resize 0 skips the
       resize (CenterCrop only, which is the identity on images already size x size). */
    MGT_TRANSFORM_RESIZE_CROP,
} mgt_transform_kind;

/* The interpolation of resizes and of the policies' geometric ops (--interpolation), as
   PIL's: bilinear (the default), bicubic (Keys, a = -0.5; within 0.5 of 255 of PIL, whose
   8-bit pass between is rounded here too) or nearest (exactly PIL's). */
typedef enum mgt_interp {
    MGT_INTERP_BILINEAR,
    MGT_INTERP_NEAREST,
    MGT_INTERP_BICUBIC,
} mgt_interp;

/* torchvision's automatic augmentation policies (--auto-augment), applied after the crop
   and flip: TrivialAugmentWide (one op of 14 at a random magnitude of 31), RandAugment (2
   ops at magnitude 9 of 31, or mgt_transform's ra_magnitude) and AutoAugment's ImageNet policy (one of 25 pairs of ops with
   their probabilities and magnitudes), each op at torchvision 0.14's magnitudes and with
   PIL's arithmetic; the choices are drawn from the sample's Philox stream. */
typedef enum mgt_auto_augment {
    MGT_AUTO_AUGMENT_NONE,
    MGT_AUTO_AUGMENT_TA_WIDE,
    MGT_AUTO_AUGMENT_RA,
    MGT_AUTO_AUGMENT_IMAGENET,
    MGT_AUTO_AUGMENT_CIFAR10, /* AutoAugment's CIFAR10 policy (25 pairs, the same ops) */
    MGT_AUTO_AUGMENT_SVHN,    /* AutoAugment's SVHN policy */
    /* AugMix(severity, mixture_width 3, chain_depth -1, alpha 1, all_ops): on a uint8 tensor,
       so its ops are torchvision's tensor arithmetic (mgt_augment_op_tensor), not PIL's */
    MGT_AUTO_AUGMENT_AUGMIX,
} mgt_auto_augment;

/* "bilinear"|"nearest"|"bicubic" and "none"|"ta_wide"|"ra"|"imagenet"|"cifar10"|"svhn"|
   "augmix"; MGT_ERR_INVALID
   with a message naming the accepted words. */
mgt_status mgt_interp_parse(const char *s, mgt_interp *out);
mgt_status mgt_auto_augment_parse(const char *s, mgt_auto_augment *out);
const char *mgt_auto_augment_name(mgt_auto_augment a);
const char *mgt_interp_name(mgt_interp m);

/* The transform of one split. Output: float [channels, size, size], normalized as
   torchvision's ToTensor + Normalize: (pixel/255 - mean) / std. Resizing is PIL's
   resampling with antialias (the filter widened by the scale factor when shrinking),
   computed in float: results match torchvision up to PIL's 8-bit rounding between the two
   passes (at most about 1/255 before normalisation). Order, as torchvision's references
   recipe: crop (+ resize) -> flip -> auto-augment policy (8-bit) -> normalise -> random
   erasing. */
typedef struct mgt_transform {
    mgt_transform_kind kind;
    int size;                      /* output height and width */
    int channels;                  /* 1 or 3 */
    int resize;                    /* RESIZE_CROP: shorter side after resize; 0: no resize */
    int padding;                   /* PAD_CROP: zeros added on every side before the crop */
    double scale_min, scale_max;   /* RRC: crop area as a fraction of the image (0.08, 1) */
    double ratio_min, ratio_max;   /* RRC: crop aspect w/h range (3/4, 4/3) */
    bool hflip;                    /* RRC, PAD_CROP: flip with probability 0.5 after the crop */
    float mean[3], std[3];         /* per channel, on the 0..1 scale */
    mgt_interp interp;             /* resizes and geometric policy ops (bilinear) */
    mgt_auto_augment auto_augment; /* training kinds only (none) */
    int augmix_severity;           /* AUGMIX: 1..10 (3) */
    int ra_magnitude;              /* RandAugment's magnitude, a bin of 31: 0..30 (9) */
    float random_erase;            /* RandomErasing's probability (0: off) */
    bool exact_decode; /* JPEGs decoded whole at full scale, torchvision's pixels (else at the
                          smallest DCT scale that covers the crop at the output size, and
                          only the crop's region) */
} mgt_transform;

/* Scratch memory of one thread's transforms, kept between calls so that a steady state makes
   no allocation. Zero-initialise; free with mgt_transform_scratch_free. */
typedef struct mgt_transform_scratch {
    void *buf; /* the resampling's taps and rows */
    size_t cap;
    void *img[2]; /* 8-bit images of the policies */
    size_t img_cap[2];
    uint64_t growths; /* times a buffer grew */
} mgt_transform_scratch;
void mgt_transform_scratch_free(mgt_transform_scratch *s);

/* The ops of the policies, torchvision's names (mgt_aug_op_name). */
typedef enum mgt_aug_op {
    MGT_AUG_IDENTITY,
    MGT_AUG_SHEAR_X,
    MGT_AUG_SHEAR_Y,
    MGT_AUG_TRANSLATE_X,
    MGT_AUG_TRANSLATE_Y,
    MGT_AUG_ROTATE,
    MGT_AUG_BRIGHTNESS,
    MGT_AUG_COLOR,
    MGT_AUG_CONTRAST,
    MGT_AUG_SHARPNESS,
    MGT_AUG_POSTERIZE,
    MGT_AUG_SOLARIZE,
    MGT_AUG_AUTOCONTRAST,
    MGT_AUG_EQUALIZE,
    MGT_AUG_INVERT,
    MGT_AUG_OP_COUNT
} mgt_aug_op;

#define MGT_AUG_MAX_SIDE 8192

const char *mgt_aug_op_name(mgt_aug_op op);
mgt_status mgt_aug_op_parse(const char *s, mgt_aug_op *out);

/* One op on an 8-bit w x h image of c (1 or 3) channels, in place, as torchvision 0.14's
   _apply_op(img, name, magnitude, interpolation, fill=None) on the PIL image: `magnitude`
   is the signed value it is handed (a shear's slope, pixels, degrees, an enhancement's
   factor - 1, bits, a threshold). */
mgt_status mgt_augment_op(mgt_aug_op op, double magnitude, mgt_interp interp, uint8_t *px, int w,
                          int h, int c, mgt_transform_scratch *scratch);

/* The magnitude of bin i of `bins` of an op in a policy's _augmentation_space for an
   img_h x img_w image (0 for ops without one); *signed_op: whether a sign is drawn. */
float mgt_augment_magnitude(mgt_auto_augment policy, mgt_aug_op op, int bins, int i, int img_h,
                            int img_w, bool *signed_op);

/* AutoAugmentPolicy.IMAGENET's sub-policies: (op, probability, magnitude bin; -1 none). */
typedef struct mgt_aa_step {
    mgt_aug_op op;
    float p;
    int bin;
} mgt_aa_step;
extern const mgt_aa_step mgt_aa_imagenet[25][2];
extern const mgt_aa_step mgt_aa_cifar10[25][2];
extern const mgt_aa_step mgt_aa_svhn[25][2];

/* One op as torchvision 0.14's _apply_op does it to a uint8 tensor (bilinear, fill None), as
   AugMix calls it: an HWC w x h image of c (1 or 3) channels, in place. */
mgt_status mgt_augment_op_tensor(mgt_aug_op op, double magnitude, uint8_t *px, int w, int h, int c,
                                 mgt_transform_scratch *scratch);

/* Where AugMix's draws come from: Dirichlet(1, ..., 1) samples of n (2 or 3) weights, and
   torch.randint(lo, hi)'s integers in [lo, hi). */
typedef struct mgt_augmix_draws {
    void (*dirichlet)(void *ctx, int n, float *out);
    int64_t (*randint)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
} mgt_augmix_draws;
/* AugMix.forward on an HWC uint8 image in place, its draws in torchvision's order (the two
   Dirichlet samples, then per chain its depth and per op the op, the bin, the sign). */
mgt_status mgt_augmix(int severity, const mgt_augmix_draws *d, uint8_t *px, int w, int h, int c,
                      mgt_transform_scratch *scratch);
/* The draws over a Philox stream. */
mgt_augmix_draws mgt_augmix_draws_philox(mgt_rng *rng);

/* ImageNet's normalisation (torchvision's reference scripts). For one channel the gray
   equivalents by the L formula: mean 0.4590, std 0.2256. */
extern const float mgt_imagenet_mean[3];
extern const float mgt_imagenet_std[3];

/* Fills *t with torchvision's defaults for `kind`: scale 0.08..1, ratio 3/4..4/3, flip on for
   the training kinds, padding 4, resize = size * 256 / 224 (256 for 224), ImageNet mean/std.
   MGT_ERR_INVALID for size < 1 or channels not 1 or 3. */
mgt_status mgt_transform_init(mgt_transform *t, mgt_transform_kind kind, int size, int channels);

/* Checks a transform's fields (ranges, std > 0); the message names the bad field. */
mgt_status mgt_transform_check(const mgt_transform *t);

/* Applies t to img (which must have t->channels channels) and writes channels*size*size
   floats to out. rng supplies the randomness of the training kinds (NULL: RESIZE_CROP only).
   scratch may be NULL (then allocates per call). MGT_ERR_OOM or MGT_ERR_INVALID. */
mgt_status mgt_transform_apply(const mgt_transform *t, const mgt_image *img, mgt_rng *rng,
                               mgt_transform_scratch *scratch, float *out);

/* A crop window in image coordinates (top may be negative where padding is added). */
typedef struct mgt_crop {
    int top, left, h, w;
} mgt_crop;

/* The resampling step alone, as torchvision's crop + resize on a PIL image: the box of img
   (NULL: all of it) scaled to out_w x out_h, written as float CHW on the 0..255 scale
   (not normalised). For tests and tools. */
mgt_status mgt_image_resize(const mgt_image *img, const mgt_crop *box, int out_w, int out_h,
                            mgt_transform_scratch *scratch, float *out);
/* The same with another interpolation. */
mgt_status mgt_image_resize_with(const mgt_image *img, const mgt_crop *box, int out_w, int out_h,
                                 mgt_interp interp, mgt_transform_scratch *scratch, float *out);

/* Where random numbers come from when computing crop parameters: Philox in a run, recorded
   draws in the golden tests. uniform returns a value in [lo, hi) rounded to float (as
   torch.empty(1).uniform_(lo, hi)); randint one in [lo, hi) (as torch.randint). */
typedef struct mgt_draws {
    double (*uniform)(void *ctx, double lo, double hi);
    int64_t (*randint)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
} mgt_draws;

/* mgt_draws over a Philox stream. */
mgt_draws mgt_draws_philox(mgt_rng *rng);

/* torchvision's RandomResizedCrop.get_params for an image of w x h: up to 10 tries of
   area = w*h*U(scale), ratio = exp(U(log ratio)), cw = round(sqrt(area*ratio)),
   ch = round(sqrt(area/ratio)) (round half to even, as Python), accepted when the crop fits,
   placed by randint; else the centre-crop fallback clamped to the ratio range. Returns the
   number of tries used, 0 when the fallback was taken. */
int mgt_transform_rrc_params(const mgt_draws *d, int w, int h, double scale_min, double scale_max,
                             double ratio_min, double ratio_max, mgt_crop *out);

/* RandomErasing.get_params for a w x h image with value 0: up to 10 tries of
   area = w*h*U(scale), aspect = exp(U(log ratio)), eh = round(sqrt(area*aspect)),
   ew = round(sqrt(area/aspect)), accepted when eh < h and ew < w, placed by randint. Returns
   the tries used, 0 when none fitted (then nothing is erased). */
int mgt_erase_params(const mgt_draws *d, int w, int h, double scale_lo, double scale_hi,
                     double ratio_lo, double ratio_hi, mgt_crop *out);

/* Resize(resize) output size for an image of w x h (shorter side -> resize, the longer
   int(resize * long / short)), and CenterCrop's window of size x size on that (top/left
   int(round((H - size) / 2)), negative with zero padding where the image is smaller). */
void mgt_transform_resize_size(int w, int h, int resize, int *out_w, int *out_h);
void mgt_transform_center_crop(int w, int h, int size, mgt_crop *out);

/* ---- DistributedSampler ---- */

typedef enum mgt_split_mode {
    MGT_SPLIT_PAD,   /* DistributedSampler(drop_last=False): pad by repeating the order's head */
    MGT_SPLIT_DROP,  /* DistributedSampler(drop_last=True): drop the tail */
    MGT_SPLIT_EXACT, /* evaluation: every sample exactly once; ranks differ by at most one */
    /* torchvision's references' RASampler (repeated augmentation, --ra-sampler): the order with
       each index repeated `reps` times in a row, padded with its head to a multiple of the
       replicas, strided over the replicas (so an image's repeats go to different devices);
       each rank keeps the first floor((n // 256) * 256 / replicas) of its share */
    MGT_SPLIT_RA,
} mgt_split_mode;

typedef struct mgt_sampler {
    size_t n;     /* dataset size */
    int replicas; /* devices */
    mgt_split_mode mode;
    int reps;     /* RA: repetitions of each index (1 otherwise) */
    bool shuffle; /* a new permutation per epoch (else the identity) */
    uint64_t seed;
    size_t num_samples; /* per replica: PyTorch's num_samples; EXACT: the largest rank's */
    size_t total_size;  /* num_samples * replicas (EXACT: n) */
} mgt_sampler;

/* MGT_ERR_INVALID when replicas < 1, or n < replicas (every device needs a sample). RA
   takes its repetitions from mgt_sampler_init_ra. */
mgt_status mgt_sampler_init(mgt_sampler *s, size_t n, int replicas, mgt_split_mode mode,
                            bool shuffle, uint64_t seed);
/* MGT_SPLIT_RA with reps >= 1 repetitions; MGT_ERR_INVALID too where the dataset leaves no
   sample to a device (fewer than 256 images: RASampler keeps n // 256 * 256 of them). */
mgt_status mgt_sampler_init_ra(mgt_sampler *s, size_t n, int replicas, int reps, bool shuffle,
                               uint64_t seed);
/* Samples rank `rank` gets per epoch. */
size_t mgt_sampler_count(const mgt_sampler *s, int rank);
/* The epoch's order of 0..n-1 before sharding (order holds n): torch.randperm's role, drawn
   from Philox keyed by seed + epoch, or the identity without shuffle. */
void mgt_sampler_order(const mgt_sampler *s, int64_t epoch, size_t *order);
/* The p-th index of rank's shard from an epoch's order (NULL: the identity):
   order[(rank + p*replicas) % n], which is PyTorch's padding and striding; RA's
   order[((rank + p*replicas) % (n reps)) / reps]. */
size_t mgt_sampler_pick(const mgt_sampler *s, const size_t *order, int rank, size_t p);
/* The place of rank's p-th sample in the epoch's (repeated) order, as the keys of its random
   draws see it: (rank + p*replicas) % (n reps) (reps 1 without RA), so a padded repeat is
   keyed as its first appearance and RA's repeats of an image each as its own. Its repeat
   number is place % reps. */
size_t mgt_sampler_place(const mgt_sampler *s, int rank, size_t p);

/* ---- bad files ---- */

/* What happens to an image that cannot be read or decoded while training. */
typedef struct mgt_bad_policy {
    bool strict;         /* any bad file is fatal (--strict-data) */
    double max_bad_frac; /* fatal once more than this fraction of the split is bad (0.01) */
    FILE *warn;          /* one line per bad file, once; NULL: stderr */
} mgt_bad_policy;

/* ---- mixup and cutmix ---- */

/* Batch-level mixing of torchvision's references recipe (--mixup-alpha, --cutmix-alpha:
   RandomMixup and RandomCutmix with p = 1, one of them chosen with even odds when both are
   on), drawn per sample so that nothing depends on the device count or the local batch: a
   sample's partner is the sample one place before it in the epoch's order (the last for the
   first), as torchvision's batch rolled by one, and its choice, lambda ~ Beta(alpha, alpha)
   and cutmix box come from Philox keyed by (seed, epoch, its place in the order). The
   target is lambda * onehot(label) + (1 - lambda) * onehot(partner's label). */
typedef struct mgt_mix {
    float mixup_alpha, cutmix_alpha; /* 0: off */
} mgt_mix;

typedef struct mgt_mix_draws {
    bool cutmix;
    double lam;   /* the weight of the sample's own image and label */
    mgt_crop box; /* cutmix: the partner's rectangle pasted in */
} mgt_mix_draws;

/* The draws of the sample at `place` of the epoch's order for an h x w output. */
void mgt_mix_draw(const mgt_mix *m, uint64_t seed, int64_t epoch, size_t place, int h, int w,
                  mgt_mix_draws *out);
/* Beta(alpha, alpha) from two Gamma draws (Marsaglia-Tsang). */
double mgt_beta_draw(mgt_rng *r, double alpha);
/* RandomCutmix's box around (rx, ry) for lambda, and the lambda the box leaves. */
void mgt_cutmix_box(double lam, int rx, int ry, int w, int h, mgt_crop *box, double *lam_out);
/* a = lam * a + (1 - lam) * b (n floats), as torch's float arithmetic does it; and the box of
   b pasted into a (c planes of h x w). */
void mgt_mixup_images(float *a, const float *b, size_t n, double lam);
void mgt_cutmix_images(float *a, const float *b, int c, int h, int w, const mgt_crop *box);

/* ---- the loader ---- */

typedef struct mgt_loader mgt_loader;

typedef struct mgt_loader_options {
    const mgt_dataset *ds; /* borrowed; outlives the loader */
    mgt_transform transform;
    int replicas;               /* shards (devices) */
    mgt_device *const *devices; /* (optional) replicas devices: batches are copied there;
                                  NULL: batches stay in host memory (tools, tests) */
    int batch_size;             /* per replica */
    int workers;                /* decode threads in total over all replicas (-j); 0: the
                                  caller of next() decodes. Each loader has its own: a
                                  validation loader's threads sleep while training runs, and
                                  a non-continuous one's sleep once its epoch is ready. */
    int prefetch;               /* ready batches queued per replica ahead of the consumer (2) */
    mgt_split_mode split;
    int ra_reps; /* MGT_SPLIT_RA's repetitions */
    bool shuffle;
    bool drop_last_batch; /* a short last batch of an epoch is dropped (else delivered) */
    bool continuous;      /* after an epoch, go on preparing the next (training) */
    uint64_t seed;
    mgt_bad_policy bad;
    mgt_abort *abort; /* (optional) the run's flag: raised on a fatal data error,
                                  and every wait of the loader leaves when it is raised */
    bool pin_threads; /* decode thread i runs on the i-th CPU of the process's mask (on) */
    mgt_mix mix;      /* mixup / cutmix (training; off by default) */
    /* (optional) a multi-node run: the sampler shards over world_replicas (0: replicas), and
       this loader's replica i is shard world_first + i */
    int world_replicas, world_first;
} mgt_loader_options;

/* Fills o with the defaults (prefetch 2, workers = cores, max_bad_frac 0.01, split PAD,
   shuffle on, continuous on, threads pinned) for a dataset, transform and replica count. */
void mgt_loader_options_init(mgt_loader_options *o, const mgt_dataset *ds, const mgt_transform *t,
                             int replicas, int batch_size);

/* Allocates every buffer the loader will use (pinned host and device memory for
   (prefetch + 1) batches per replica) and starts the decode threads, which wait for
   mgt_loader_set_epoch. Errors: bad options, fewer samples than replicas (naming the split
   folder), allocation. */
mgt_status mgt_loader_create(const mgt_loader_options *o, mgt_loader **out);

/* Stops the threads (promptly: each finishes the image in hand), waits for copies in flight
   and frees everything. Call it once no thread is inside mgt_loader_next, and before the
   devices are freed. NULL is a no-op. */
void mgt_loader_free(mgt_loader *l);

/* Batches per epoch for a rank (ranks differ only in the EXACT split). */
size_t mgt_loader_batches(const mgt_loader *l, int rank);
const mgt_sampler *mgt_loader_sampler(const mgt_loader *l);

/* Positions every rank at batch `first_batch` of `epoch` (resume sets first_batch > 0).
   When the loader is already preparing exactly that (continuous mode after an epoch), the
   work prefetched is kept; otherwise it is dropped. Call it while no thread is inside
   mgt_loader_next. */
mgt_status mgt_loader_set_epoch(mgt_loader *l, int64_t epoch, size_t first_batch);

typedef struct mgt_batch {
    float *images;              /* [n, channels, size, size]; device memory of the rank's device
                               (host memory without devices) */
    int32_t *labels;            /* [n], beside the images */
    int32_t *labels_b;          /* [n], the mixing partner's label (else = labels) */
    float *weights;             /* [n], the weight of labels (lambda; else 1) */
    const int32_t *labels_host; /* [n], host copies of the three */
    const int32_t *labels_b_host;
    const float *weights_host;
    bool mixed;                 /* the loader mixes (labels_b and weights mean something) */
    const size_t *indices_host; /* [n], the dataset index behind each slot (after any
                                    bad-file replacement) */
    int n;                      /* samples in this batch (the last one of an epoch may be short) */
    int64_t epoch;
    size_t index;  /* batch number within the epoch */
    double wait_s; /* how long this call blocked for the batch */
} mgt_batch;

/* The rank's next batch. With devices, `compute` (the stream that will read the batch) is
   made to wait for the batch's copy, and the batch stays valid until the rank's next call,
   which marks on `compute` the point after which the loader may overwrite it: so enqueue
   all reads of a batch on `compute` before asking for the next one. Without devices compute
   is ignored and may be NULL. Errors: MGT_ERR_ABORTED (the abort flag), a fatal data error
   (its text), MGT_ERR_INVALID past the last batch of a non-continuous epoch. */
mgt_status mgt_loader_next(mgt_loader *l, int rank, mgt_stream *compute, mgt_batch *out);

/* The loader's fatal error, if it has had one (a bad file under --strict-data, too many bad
   files, a failed copy): its status, with its text set as this thread's error; MGT_OK when
   none. For a caller that was woken by the abort flag and needs the cause. */
mgt_status mgt_loader_error(mgt_loader *l);

/* Seconds the rank's calls to next() have blocked, in total, and how many calls (the
   trainer's "Data" time; each batch's own wait is mgt_batch.wait_s). */
double mgt_loader_wait_total(const mgt_loader *l, int rank, long *calls);
/* Distinct bad files met so far. */
size_t mgt_loader_bad_count(const mgt_loader *l);
/* Images decoded and transformed so far, all threads. */
uint64_t mgt_loader_images_done(const mgt_loader *l);
/* Times a decode thread's buffers (file, decoder, transform scratch) had to grow, all
   threads: it stops rising once the largest image has been seen, so a steady state
   allocates nothing per image. */
uint64_t mgt_loader_buffer_growths(const mgt_loader *l);

/* ---- whole-split passes ---- */

/* Decodes every file of the split on `workers` threads (0: cores) and calls report() for
   each bad one, in index order, with its reason; *bad_count = how many. report may be NULL.
   For `mgtrain check-data`. */
typedef void (*mgt_bad_report_fn)(void *ctx, size_t index, const char *reason);
mgt_status mgt_data_check(const mgt_dataset *ds, int workers, const mgt_abort *abort,
                          FILE *progress, mgt_bad_report_fn report, void *ctx, size_t *bad_count);

/* Per-channel mean and std (population) of pixel/255 over the decoded images (native size,
   `channels` channels) for `--normalize auto`. max_images > 0 looks at that many images
   evenly spread over the split; 0: all. Bad files are passed over. */
mgt_status mgt_data_stats(const mgt_dataset *ds, int channels, size_t max_images, int workers,
                          const mgt_abort *abort, float mean[3], float std[3]);

/* ---- IDX files and the Fashion-MNIST import ---- */

/* An IDX file (LeCun's MNIST format), gzip-compressed or not. Only unsigned-byte data. */
typedef struct mgt_idx {
    int ndim;
    uint32_t dims[4];
    uint8_t *data; /* owned; product of dims bytes */
    size_t size;
} mgt_idx;
/* Errors name the path: unreadable, not IDX, a type other than ubyte, truncated. */
mgt_status mgt_idx_read(const char *path, mgt_idx *out);
void mgt_idx_free(mgt_idx *idx);

/* Fashion-MNIST's classes as folder names, in the dataset's label order: T-shirt_top Trouser
   Pullover Dress Coat Sandal Shirt Sneaker Bag Ankle_boot ("T-shirt/top" and "Ankle boot"
   with the slash and the space made '_'). */
extern const char *const mgt_fashion_mnist_classes[10];

/* Writes src_dir's train-* and t10k-* IDX files as out_dir/{train,val}/<class>/NNNNN.png
   (NNNNN = position in the IDX file); per_class > 0 keeps only the first per_class images
   of each class of each file (data/sample's 30). The PNGs are stb_image_write's, a function
   of the pixels: the same files every time. Idempotent: when out_dir/.mgtrain-import-done
   exists (written last, after everything is flushed) it does nothing and sets *already.
   progress may be NULL. */
mgt_status mgt_data_import_fashion_mnist(const char *src_dir, const char *out_dir, size_t per_class,
                                         FILE *progress, bool *already);

#endif
