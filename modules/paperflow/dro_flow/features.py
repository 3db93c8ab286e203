"""CIFAR-10 features for Sec. 6.3 without torchvision (paper scale only).

torchvision cannot be installed beside the pinned torch, so the ResNet-50 is written here in plain
torch with torchvision's parameter names, and loads torchvision's IMAGENET1K_V1 state dict
(`resnet50-0676ba61.pth`) directly. Its fc is replaced by a seeded, untrained Linear(2048, 512) +
ReLU as in the official code; the images are resized to 224 x 224 (bilinear) and ImageNet-normalised.
The CIFAR-10 python tarball is read with tarfile + pickle.
"""

from __future__ import annotations

import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FEATURE_DIM = 512


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """ResNet-50 v1.5 (stride in the 3x3 conv), parameter names as torchvision's `resnet50`."""

    def __init__(self, n_out: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 64
        for i, (planes, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=1):
            down = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )
            layers = [Bottleneck(inplanes, planes, stride, down)] + [
                Bottleneck(planes * 4, planes) for _ in range(blocks - 1)
            ]
            setattr(self, f"layer{i}", nn.Sequential(*layers))
            inplanes = planes * 4
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc: nn.Module = nn.Linear(2048, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def feature_extractor(weights: str | Path | None, head_seed: int) -> ResNet50:
    """The backbone with ImageNet weights (None: random, for tests) and the seeded 512-d ReLU head."""
    model = ResNet50()
    if weights is not None:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    torch.manual_seed(head_seed)
    model.fc = nn.Sequential(nn.Linear(2048, FEATURE_DIM), nn.ReLU())
    return model.eval()


def read_cifar10(
    tarball: str | Path, *, sha256: str | None, root: str | Path | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{'train': (50000, 3, 32, 32) uint8 images and labels, 'test': (10000, ...)} from the python tarball. Its
    batches are pickles and the host publishes only torchvision's md5, so the tarball is read only once its sha256
    is the config's `sha256` or the one the first pinned download recorded in config/locks/dro_flow.json
    (`paperflow.core.download.require_sha256`; WeakPinError otherwise)."""
    from paperflow.core.download import require_sha256

    require_sha256(tarball, slug="dro_flow", sha256=sha256, key="datasets.cifar10.data.images_sha256", root=root)
    parts: dict[str, list] = {"train": [], "test": []}
    with tarfile.open(tarball, "r:gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            split = "train" if name.startswith("data_batch_") else "test" if name == "test_batch" else None
            if split:
                batch = pickle.load(tar.extractfile(member), encoding="bytes")
                parts[split].append(
                    (np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(batch[b"labels"]))
                )
    return {k: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v])) for k, v in parts.items()}


def preprocess_images(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, 32, 32) -> float, resized to 224 and ImageNet-normalised."""
    x = F.interpolate(images.float() / 255.0, size=(224, 224), mode="bilinear", align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def extract(model: nn.Module, images: np.ndarray, batch_size: int, device: str) -> np.ndarray:
    model = model.to(device)
    out = []
    with torch.no_grad():
        for start in tqdm(range(0, len(images), batch_size), desc="features", disable=None, mininterval=10):
            batch = torch.as_tensor(images[start : start + batch_size], device=device)
            out.append(model(preprocess_images(batch)).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def write_features(
    tarball: str | Path,
    tarball_sha256: str | None,
    weights: str | Path,
    head_seed: int,
    batch_size: int,
    train_out: str | Path,
    test_out: str | Path,
) -> str:
    """The 512-d features of both CIFAR-10 splits as Parquet (x0..x511, y); returns the device used. `tarball_sha256`
    is the config's checksum of the tarball (read_cifar10 checks the tarball before unpickling)."""
    import pandas as pd

    from paperflow.core.io import write_frame

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = feature_extractor(weights, head_seed)
    splits = read_cifar10(tarball, sha256=tarball_sha256)
    for split, out in (("train", train_out), ("test", test_out)):
        images, labels = splits[split]
        feats = extract(model, images, batch_size, device)
        frame = pd.DataFrame(feats.astype(np.float64), columns=[f"x{j}" for j in range(feats.shape[1])])
        frame["y"] = labels.astype(np.int64)
        write_frame(
            out,
            frame,
            {"dataset": "cifar10", "head_seed": head_seed, "backbone": "resnet50 IMAGENET1K_V1", "part": split},
        )
        log.info("%s: %d x %d features on %s", split, *feats.shape, device)
    return device
