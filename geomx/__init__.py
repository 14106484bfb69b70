"""geomx: geo-distributed training on a two-tier parameter server (HiPS), emulated or real."""
__version__ = "0.1.0"
