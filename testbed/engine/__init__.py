"""The real engine. Its modules import torch; this package and `options` do not, so the
config schema can name the engine's choices on the light install."""
