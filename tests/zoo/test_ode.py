"""Fixed-grid ODE solvers: torchdiffeq's ``FixedGridODESolver`` stepping over ``zip(t[:-1],
t[1:])`` with the Euler, midpoint and RK4 steps; the oracle is ``torchdiffeq.odeint``."""

from ._harness import *  # noqa: F403

NAMES = ["ode-euler", "ode-midpoint", "ode-rk4"]
