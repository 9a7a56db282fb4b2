"""A batched Kalman filter (filterpy's ``predict``/``update``, Joseph form) with missing
observations masked; the oracle is the Python loop."""

from ._harness import *  # noqa: F403

NAMES = ["kalman-scalar"]
