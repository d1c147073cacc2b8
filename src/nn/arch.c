/* Architecture policy: per architecture name, its family and what torchvision's reference
   scripts (or the paper that defines it) train and validate it with, so that the trainer and
   the tools ask one table instead of repeating lists of names. A new architecture is one row:
   IMAGENET(name, family) for the torchvision recipe at 224, CIFAR(name, family) for the
   32x32 recipe at the images' own size, or a full initialiser where it differs (e.g. an input
   side of 299). */
#include <string.h>

#include "mgt/nn.h"

/* torchvision's ImageNet recipe: RandomResizedCrop(224) + flip; Resize(256) + CenterCrop(224) */
#define IMAGENET(name, family)                                                        \
    {                                                                                 \
        name, family, 224, 224, 1000, MGT_ARCH_AUGMENT_RRC, MGT_ARCH_EVAL_RESIZE_CROP \
    }
/* He et al. 2016's CIFAR recipe: 4-pixel pad + random crop + flip at the images' own side */
#define CIFAR(name, family)                                                      \
    {                                                                            \
        name, family, 0, 32, 10, MGT_ARCH_AUGMENT_PAD_CROP, MGT_ARCH_EVAL_NATIVE \
    }

static const mgt_arch_info archs[] = {
    IMAGENET("resnet18", "resnet"),
    IMAGENET("resnet34", "resnet"),
    IMAGENET("resnet50", "resnet"),
    IMAGENET("resnet101", "resnet"),
    IMAGENET("resnet152", "resnet"),
    IMAGENET("resnext50_32x4d", "resnet"),
    IMAGENET("resnext101_32x8d", "resnet"),
    IMAGENET("wide_resnet50_2", "resnet"),
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
    IMAGENET("mobilenet_v2", "mobilenet"),
    IMAGENET("mobilenet_v3_large", "mobilenet"),
    IMAGENET("mobilenet_v3_small", "mobilenet"),
    IMAGENET("efficientnet_b0", "efficientnet"),
    /* torchvision's weights for b1 are evaluated at 240 (resize 255); the trainer's recipe
       keeps the 224 of the reference scripts' default */
    IMAGENET("efficientnet_b1", "efficientnet"),
    IMAGENET("regnet_x_400mf", "regnet"),
    IMAGENET("regnet_y_400mf", "regnet"),
    IMAGENET("shufflenet_v2_x0_5", "shufflenet"),
    IMAGENET("shufflenet_v2_x1_0", "shufflenet"),
    IMAGENET("densenet121", "densenet"),
    IMAGENET("densenet169", "densenet"),
    IMAGENET("convnext_tiny", "convnext"),
    IMAGENET("vit_b_16", "vit"),
    IMAGENET("vit_b_32", "vit"),
    IMAGENET("vit_l_16", "vit"),
    IMAGENET("vit_l_32", "vit"),
    IMAGENET("vit_h_14", "vit"),
    CIFAR("vit_tiny_4", "cifar_vit"),
    IMAGENET("swin_t", "swin"),
    IMAGENET("swin_s", "swin"),
    IMAGENET("swin_b", "swin"),
    IMAGENET("swin_v2_t", "swin"),
    IMAGENET("swin_v2_s", "swin"),
    IMAGENET("swin_v2_b", "swin"),
    IMAGENET("maxvit_t", "maxvit"),
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
