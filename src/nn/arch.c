/* Architecture policy: per architecture name, its family and what torchvision's reference
   scripts (or the paper that defines it) train and validate it with, so that the trainer and
   the tools ask one table instead of repeating lists of names. A new architecture is one row:
   IMAGENET(name, family) for the torchvision recipe at 224, CIFAR(name, family) for the
   32x32 recipe at the images' own size, IMAGENET_AT(name, family, crop, resize) where
   torchvision's weights are evaluated at another crop or resize (their IMAGENET1K_V1
   transforms; the smallest crop of the weights where there is no V1), or a full initialiser
   where more differs (the auxiliary heads' loss weight, transform_input). */
#include <string.h>

#include "mgt/nn.h"

/* torchvision's ImageNet recipe: RandomResizedCrop(224) + flip; Resize(256) + CenterCrop(224) */
#define IMAGENET(name, family) IMAGENET_AT(name, family, 224, 0)
/* The same at a crop and a validation resize of their own */
#define IMAGENET_AT(name_, family_, crop, resize)                                     \
    {                                                                                 \
        .name = name_, .family = family_, .image_size = crop, .synthetic_size = crop, \
        .synthetic_classes = 1000, .augment = MGT_ARCH_AUGMENT_RRC,                   \
        .eval = MGT_ARCH_EVAL_RESIZE_CROP, .resize_size = resize                      \
    }
/* He et al. 2016's CIFAR recipe: 4-pixel pad + random crop + flip at the images' own side */
#define CIFAR(name_, family_)                                                    \
    {                                                                            \
        .name = name_, .family = family_, .image_size = 0, .synthetic_size = 32, \
        .synthetic_classes = 10, .augment = MGT_ARCH_AUGMENT_PAD_CROP,           \
        .eval = MGT_ARCH_EVAL_NATIVE                                             \
    }

static const mgt_arch_info archs[] = {
    IMAGENET("resnet18", "resnet"),
    IMAGENET("resnet34", "resnet"),
    IMAGENET("resnet50", "resnet"),
    IMAGENET("resnet101", "resnet"),
    IMAGENET("resnet152", "resnet"),
    IMAGENET("resnext50_32x4d", "resnet"),
    IMAGENET("resnext101_32x8d", "resnet"),
    IMAGENET_AT("resnext101_64x4d", "resnet", 224, 232),
    IMAGENET("wide_resnet50_2", "resnet"),
    IMAGENET("wide_resnet101_2", "resnet"),
    CIFAR("resnet20", "cifar_resnet"),
    CIFAR("resnet32", "cifar_resnet"),
    CIFAR("resnet44", "cifar_resnet"),
    CIFAR("resnet56", "cifar_resnet"),
    CIFAR("resnet110", "cifar_resnet"),
    IMAGENET("vgg11", "vgg"),
    IMAGENET("vgg13", "vgg"),
    IMAGENET("vgg16", "vgg"),
    IMAGENET("vgg19", "vgg"),
    IMAGENET("vgg11_bn", "vgg"),
    IMAGENET("vgg13_bn", "vgg"),
    IMAGENET("vgg16_bn", "vgg"),
    IMAGENET("vgg19_bn", "vgg"),
    IMAGENET("alexnet", "alexnet"),
    IMAGENET("squeezenet1_0", "squeezenet"),
    IMAGENET("squeezenet1_1", "squeezenet"),
    /* the auxiliary losses' weights: 0.3 each is GoogLeNet's paper's (Szegedy et al. 2015, "Going
       deeper with convolutions", section 5); 0.4 is TF-slim's train_image_classifier.py for
       Inception v3 (the training its ported weights come from) */
    {.name = "googlenet",
     .family = "googlenet",
     .image_size = 224,
     .synthetic_size = 224,
     .synthetic_classes = 1000,
     .augment = MGT_ARCH_AUGMENT_RRC,
     .eval = MGT_ARCH_EVAL_RESIZE_CROP,
     .aux_weight = 0.3f,
     .transform_input = true,
     .pretrained_drops_aux = true},
    {.name = "inception_v3",
     .family = "inception",
     .image_size = 299,
     .synthetic_size = 299,
     .synthetic_classes = 1000,
     .augment = MGT_ARCH_AUGMENT_RRC,
     .eval = MGT_ARCH_EVAL_RESIZE_CROP,
     .resize_size = 342,
     .aux_weight = 0.4f,
     .transform_input = true},
    IMAGENET("mobilenet_v2", "mobilenet"),
    IMAGENET("mobilenet_v3_large", "mobilenet"),
    IMAGENET("mobilenet_v3_small", "mobilenet"),
    IMAGENET("mnasnet0_5", "mnasnet"),
    IMAGENET_AT("mnasnet0_75", "mnasnet", 224, 232),
    IMAGENET("mnasnet1_0", "mnasnet"),
    IMAGENET_AT("mnasnet1_3", "mnasnet", 224, 232),
    IMAGENET("efficientnet_b0", "efficientnet"),
    IMAGENET_AT("efficientnet_b1", "efficientnet", 240, 256),
    IMAGENET_AT("efficientnet_b2", "efficientnet", 288, 288),
    IMAGENET_AT("efficientnet_b3", "efficientnet", 300, 320),
    IMAGENET_AT("efficientnet_b4", "efficientnet", 380, 384),
    IMAGENET_AT("efficientnet_b5", "efficientnet", 456, 456),
    IMAGENET_AT("efficientnet_b6", "efficientnet", 528, 528),
    IMAGENET_AT("efficientnet_b7", "efficientnet", 600, 600),
    /* the references train V2-S at 300 and V2-M at 384 (--train-crop-size) and validate at
       the crop below: one input size per run here, the validation's */
    IMAGENET_AT("efficientnet_v2_s", "efficientnet", 384, 384),
    IMAGENET_AT("efficientnet_v2_m", "efficientnet", 480, 480),
    IMAGENET_AT("efficientnet_v2_l", "efficientnet", 480, 480),
    IMAGENET("regnet_x_400mf", "regnet"),
    IMAGENET("regnet_x_800mf", "regnet"),
    IMAGENET("regnet_x_1_6gf", "regnet"),
    IMAGENET("regnet_x_3_2gf", "regnet"),
    IMAGENET("regnet_x_8gf", "regnet"),
    IMAGENET("regnet_x_16gf", "regnet"),
    IMAGENET("regnet_x_32gf", "regnet"),
    IMAGENET("regnet_y_400mf", "regnet"),
    IMAGENET("regnet_y_800mf", "regnet"),
    IMAGENET("regnet_y_1_6gf", "regnet"),
    IMAGENET("regnet_y_3_2gf", "regnet"),
    IMAGENET("regnet_y_8gf", "regnet"),
    IMAGENET("regnet_y_16gf", "regnet"),
    IMAGENET("regnet_y_32gf", "regnet"),
    /* SWAG weights only (torchvision trained none on ImageNet-1K alone): the linear probe's */
    IMAGENET_AT("regnet_y_128gf", "regnet", 224, 224),
    IMAGENET("shufflenet_v2_x0_5", "shufflenet"),
    IMAGENET("shufflenet_v2_x1_0", "shufflenet"),
    IMAGENET_AT("shufflenet_v2_x1_5", "shufflenet", 224, 232),
    IMAGENET_AT("shufflenet_v2_x2_0", "shufflenet", 224, 232),
    IMAGENET("densenet121", "densenet"),
    IMAGENET("densenet161", "densenet"),
    IMAGENET("densenet169", "densenet"),
    IMAGENET("densenet201", "densenet"),
    IMAGENET_AT("convnext_tiny", "convnext", 224, 236),
    IMAGENET_AT("convnext_small", "convnext", 224, 230),
    IMAGENET_AT("convnext_base", "convnext", 224, 232),
    IMAGENET_AT("convnext_large", "convnext", 224, 232),
    IMAGENET("vit_b_16", "vit"),
    IMAGENET("vit_b_32", "vit"),
    IMAGENET_AT("vit_l_16", "vit", 224, 242),
    IMAGENET("vit_l_32", "vit"),
    /* SWAG weights only: the linear probe's, as regnet_y_128gf */
    IMAGENET_AT("vit_h_14", "vit", 224, 224),
    CIFAR("vit_tiny_4", "cifar_vit"),
    IMAGENET_AT("swin_t", "swin", 224, 232),
    IMAGENET_AT("swin_s", "swin", 224, 246),
    IMAGENET_AT("swin_b", "swin", 224, 238),
    IMAGENET_AT("swin_v2_t", "swin", 256, 260),
    IMAGENET_AT("swin_v2_s", "swin", 256, 260),
    IMAGENET_AT("swin_v2_b", "swin", 256, 272),
    IMAGENET_AT("maxvit_t", "maxvit", 224, 224),
};

const mgt_arch_info *mgt_arch_list(int *n)
{
    *n = (int)(sizeof archs / sizeof *archs);
    return archs;
}

const mgt_arch_info *mgt_arch_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof archs / sizeof *archs; i++)
        if (strcmp(archs[i].name, name) == 0)
            return &archs[i];
    return NULL;
}

int mgt_arch_image_size(const mgt_arch_info *a, int width, int height)
{
    if (a->image_size > 0)
        return a->image_size;
    return width < height ? width : height;
}

int mgt_arch_resize_size(const mgt_arch_info *a, int size)
{
    if (a->resize_size <= 0 || a->image_size <= 0)
        return (int)((long)size * 256 / 224);
    if (size == a->image_size)
        return a->resize_size;
    return (int)(((long)size * a->resize_size + a->image_size / 2) / a->image_size);
}
