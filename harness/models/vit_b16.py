"""torchvision ViT-B/16, image classification, cross-entropy.

The defaults are the usual ImageNet shape (224x224: 196 patches + class
token); `device` may be "meta" to record without computing.
"""
import torch
import torch.nn.functional as F
import torchvision


def build(batch=32, resolution=224, classes=1000, steps=2, device="cpu", seed=0):
    torch.manual_seed(seed)
    model = torchvision.models.vit_b_16(image_size=resolution, num_classes=classes).to(device)
    batches = [(torch.randn(batch, 3, resolution, resolution, device=device),
                torch.randint(0, classes, (batch,), device=device)) for _ in range(steps)]
    return {"model": model, "batches": batches, "loss_fn": F.cross_entropy, "name": "vit_b16",
            "meta": {"batch": batch, "resolution": resolution}}
