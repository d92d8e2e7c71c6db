"""ResNet-50 training benchmark with two backends behind one CLI and one run record.

`--framework tensorflow`: Keras 3 `keras.applications.ResNet50` (v1), custom loop under
MirroredStrategy / MultiWorkerMirroredStrategy. `--framework pytorch`: torchvision `resnet50`
(v1.5), DDP. See docs/resnet50.md.
"""
