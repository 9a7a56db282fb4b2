"""Diffusion samplers: DDPM (improved-diffusion's ``p_sample_loop``, a reverse scan over the
timestep table, with the noise given or drawn in the step) and DDIM (diffusers' ``DDIMScheduler``
in the pipeline loop); the oracle is the Python loop."""

from ._harness import *  # noqa: F403

NAMES = ["ddpm-sample", "ddpm-sample-randn", "ddim-sample"]
