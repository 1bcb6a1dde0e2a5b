"""Models to capture: the built-in examples (``builtin``, in plain PyTorch), a wider zoo of
torchvision-style architectures and edge cases (``vision``, in plain PyTorch) and Hugging Face models
built from their config on meta tensors (``hf``, needs ``pip install 'fxcost[hf]'``)."""

from fxcost.zoo.builtin import Autocast, build, load, names

__all__ = ["Autocast", "build", "load", "names"]
