"""Shared test problems with closed-form solutions and closed-form gradients.

Each `Problem` builds a fresh symbolic graph (objective or equations, the unknown `x`, the
parameters θ by name, an initial guess), and gives, as plain numpy, the solution x*(θ) and the
pullback of a linear loss L = Σ w ⊙ x* (``vjp``): the analytic gradient ∂L/∂θ for every
float parameter. The tests compare pymc_optim against these, against direct scipy calls and
against central finite differences (helpers at the bottom of this module).

Derivations of the pullbacks are written next to each problem: with K a matrix of the
parameters, x* = K⁻¹b gives dx* = −K⁻¹(dK)x* + K⁻¹db, so ∂L/∂b = u and ∂L/∂K = −u x*ᵀ with
u = K⁻ᵀw; everything else is the chain rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pytensor
import pytensor.tensor as pt
import scipy.linalg
from pytensor.graph.replace import clone_replace

__all__ = [
    "MINIMIZE_PROBLEMS",
    "MINIMIZE_SCALAR_PROBLEMS",
    "ROOT_PROBLEMS",
    "ROOT_SCALAR_PROBLEMS",
    "Built",
    "CompiledSolve",
    "FlatProblem",
    "Problem",
    "as_list",
    "by_name",
    "central_difference",
    "check_gradient_closed_form",
    "check_gradient_finite_differences",
    "check_value",
    "compiled_solve",
    "counters",
    "fast_function",
    "loss_weights",
    "newton_node",
    "numeric_x0",
    "poisson_intercepts",
    "raveled",
    "theta_point",
    "unlist",
    "weighted_loss",
]

RNG_SEED = 20240917


class Built(NamedTuple):
    """A freshly built problem graph."""

    output: Any  # objective (scalar) for minimize, equations (one or a list) for root
    x: Any  # a TensorVariable or a list of them
    params: dict[str, pt.TensorVariable]
    x0: Any  # numbers/arrays (or symbolic expressions of the params), like `x`


@dataclass(frozen=True)
class Problem:
    """A test problem.

    Attributes
    ----------
    name : readable test id.
    build : () -> Built, a fresh graph every call.
    values : the test parameter values, by name (integer ones as int64 arrays).
    solution : values -> x* (an array, or a list of arrays when `x` is a list).
    vjp : (values, w) -> {name: ∂(Σ w ⊙ x*)/∂θ_name} for every float parameter; `w` is shaped
        like x* (a list when `x` is a list).
    convex : whether the objective is convex everywhere (dogleg needs a positive definite
        Hessian at every iterate).
    zero_gradient : parameters whose gradient is exactly zero (they do not move x*).
    bracket : a sign-changing / minimum-bracketing interval for the scalar solvers.
    fd_step : the central-difference step the tests use (see where it is not 1e-4).
    """

    name: str
    build: Callable[[], Built]
    values: dict[str, np.ndarray]
    solution: Callable[[dict], Any]
    vjp: Callable[[dict, Any], dict[str, np.ndarray]]
    convex: bool = True
    zero_gradient: tuple[str, ...] = ()
    bracket: tuple[float, float] | None = None
    fd_step: float = 1e-4

    def __repr__(self) -> str:
        return self.name

    @property
    def float_names(self) -> list[str]:
        return [k for k, v in self.values.items() if np.asarray(v).dtype.kind == "f"]


def _rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def _spd_root(n: int, rng: np.random.Generator) -> np.ndarray:
    """A well-conditioned square matrix (eigenvalues of MMᵀ between ~0.3 and ~3)."""
    return np.eye(n) + 0.3 * rng.standard_normal((n, n))


# ---------------------------------------------------------------------------------------------
# minimize
# ---------------------------------------------------------------------------------------------


def _scalar_exp() -> Built:
    # f = exp(x) − a·x, x 0-d: x* = log a.
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(pt.exp(x) - a * x, x, {"a": a}, 0.0)


def _vector_quadratic() -> Built:
    # f = ½ xᵀ(MMᵀ + sI)x − bᵀx: scalar s, vector b and matrix M at once.
    x = pt.vector("x", shape=(3,))
    s, b, M = pt.scalar("s"), pt.vector("b", shape=(3,)), pt.matrix("M", shape=(3, 3))
    K = M @ M.T + s * pt.eye(3)
    return Built(0.5 * x @ K @ x - b @ x, x, {"s": s, "b": b, "M": M}, np.zeros(3))


def _vector_quadratic_solution(v):
    return np.linalg.solve(v["M"] @ v["M"].T + v["s"] * np.eye(3), v["b"])


def _vector_quadratic_vjp(v, w):
    # x* = K⁻¹b, K = MMᵀ + sI symmetric; u = K⁻¹w.
    # dL = uᵀdb − uᵀ(dM Mᵀ + M dMᵀ + ds I)x*  ⇒  ∂L/∂M = −(u (Mᵀx*)ᵀ + x* (Mᵀu)ᵀ).
    M = v["M"]
    K = M @ M.T + v["s"] * np.eye(3)
    x = np.linalg.solve(K, v["b"])
    u = np.linalg.solve(K, w)
    return {"s": -u @ x, "b": u, "M": -(np.outer(u, M.T @ x) + np.outer(x, M.T @ u))}


def _matrix_x() -> Built:
    # f = ½ tr(xᵀKx) − tr(Cᵀx), x a (2, 3) matrix, K = SSᵀ + I: x* = K⁻¹C.
    x = pt.matrix("x", shape=(2, 3))
    C, S = pt.matrix("C", shape=(2, 3)), pt.matrix("S", shape=(2, 2))
    K = S @ S.T + pt.eye(2)
    return Built(0.5 * pt.sum(x * (K @ x)) - pt.sum(C * x), x, {"C": C, "S": S}, np.zeros((2, 3)))


def _matrix_x_solution(v):
    return np.linalg.solve(v["S"] @ v["S"].T + np.eye(2), v["C"])


def _matrix_x_vjp(v, W):
    # U = K⁻¹W; dL = tr(Uᵀ dC) − tr(Uᵀ(dS Sᵀ + S dSᵀ)x*)  ⇒  ∂L/∂S = −(U x*ᵀ S + x* Uᵀ S).
    S = v["S"]
    K = S @ S.T + np.eye(2)
    x = np.linalg.solve(K, v["C"])
    U = np.linalg.solve(K, W)
    return {"C": U, "S": -(U @ x.T @ S + x @ U.T @ S)}


def _two_variables() -> Built:
    # x = [u (2,), v (0-d)], f = ½‖u − a‖² + ½(v − c·uᵀu)²: u* = a, v* = c·aᵀa; the Hessian
    # couples u and v (off-diagonal blocks −2c·u).
    u, v = pt.vector("u", shape=(2,)), pt.scalar("v")
    a, c = pt.vector("a", shape=(2,)), pt.scalar("c")
    f = 0.5 * pt.sum((u - a) ** 2) + 0.5 * (v - c * (u @ u)) ** 2
    return Built(f, [u, v], {"a": a, "c": c}, [np.array([0.5, 0.5]), 0.0])


def _disconnected() -> Built:
    # f = exp(e)·‖x − a‖² + d²: d sits only outside the x-dependent part of the graph, e multiplies
    # a term whose x-derivative vanishes at x* = a. Neither moves x*.
    x = pt.vector("x", shape=(2,))
    a, d, e = pt.vector("a", shape=(2,)), pt.scalar("d"), pt.scalar("e")
    f = pt.exp(e) * pt.sum((x - a) ** 2) + d**2
    return Built(f, x, {"a": a, "d": d, "e": e}, np.zeros(2))


def _shared_parameter() -> Built:
    # f = Σ ½eᵃx² − a·x: `a` is used twice (as a and inside exp(a)); x* = a·e⁻ᵃ. The initial
    # guess is an expression of `a` too, which must not add to the gradient. Written eᵃx²/2, not
    # 0.5·eᵃx²: the latter hits the bug pinned by an xfail in test_minimize.py.
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    f = pt.sum(pt.exp(a) * x**2 / 2 - a * x)
    return Built(f, x, {"a": a}, 0.5 * a)


def _integer_parameter() -> Built:
    # f = Σ cosh(k·x[perm] − a) with integer k (0-d) and integer perm (vector) used directly on x:
    # x*[perm] = a/k.
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    k, perm = pt.scalar("k", dtype="int64"), pt.vector("perm", dtype="int64", shape=(3,))
    return Built(pt.sum(pt.cosh(k * x[perm] - a)), x, {"a": a, "k": k, "perm": perm}, np.zeros(3))


def _integer_solution(v, f=lambda a: a):
    x = np.empty(3)
    x[v["perm"]] = f(v["a"]) / v["k"]
    return x


def _rosenbrock() -> Built:
    # f = (a − x₀)² + b(x₁ − x₀²)²: x* = (a, a²), independent of b; not convex.
    x = pt.vector("x", shape=(2,))
    a, b = pt.scalar("a"), pt.scalar("b")
    return Built((a - x[0]) ** 2 + b * (x[1] - x[0] ** 2) ** 2, x, {"a": a, "b": b}, [0.9, 0.9])


def _minimize_problems() -> list[Problem]:
    rng = _rng()
    return [
        Problem(
            "scalar_exp",
            _scalar_exp,
            {"a": np.array(2.5)},
            lambda v: np.log(v["a"]),
            lambda v, w: {"a": w / v["a"]},
        ),
        Problem(
            "vector_quadratic",
            _vector_quadratic,
            {"s": np.array(0.7), "b": rng.standard_normal(3), "M": _spd_root(3, rng)},
            _vector_quadratic_solution,
            _vector_quadratic_vjp,
        ),
        Problem(
            "matrix_x",
            _matrix_x,
            {"C": rng.standard_normal((2, 3)), "S": _spd_root(2, rng)},
            _matrix_x_solution,
            _matrix_x_vjp,
        ),
        Problem(
            "two_variables",
            _two_variables,
            {"a": np.array([0.8, -0.6]), "c": np.array(0.7)},
            lambda v: [v["a"], v["c"] * v["a"] @ v["a"]],
            lambda v, w: {
                "a": w[0] + w[1] * 2 * v["c"] * v["a"],
                "c": w[1] * v["a"] @ v["a"],
            },
            convex=False,
        ),
        Problem(
            "disconnected",
            _disconnected,
            {"a": np.array([0.3, -1.2]), "d": np.array(0.4), "e": np.array(-0.3)},
            lambda v: v["a"],
            lambda v, w: {"a": w, "d": np.array(0.0), "e": np.array(0.0)},
            zero_gradient=("d", "e"),
        ),
        Problem(
            "shared_parameter",
            _shared_parameter,
            {"a": np.array([0.4, 1.1, -0.5])},
            lambda v: v["a"] * np.exp(-v["a"]),
            lambda v, w: {"a": w * (1 - v["a"]) * np.exp(-v["a"])},
        ),
        Problem(
            "integer_parameter",
            _integer_parameter,
            {
                "a": np.array([0.6, -0.9, 1.5]),
                "k": np.array(2, dtype="int64"),
                "perm": np.array([2, 0, 1], dtype="int64"),
            },
            _integer_solution,
            # x*[perm_i] = a_i / k  ⇒  ∂L/∂a_i = w[perm_i] / k.
            lambda v, w: {"a": w[v["perm"]] / v["k"]},
        ),
        Problem(
            "rosenbrock",
            _rosenbrock,
            {"a": np.array(1.2), "b": np.array(5.0)},
            lambda v: np.array([v["a"], v["a"] ** 2]),
            lambda v, w: {"a": w[0] + 2 * v["a"] * w[1], "b": np.array(0.0)},
            convex=False,
            zero_gradient=("b",),
        ),
    ]


# ---------------------------------------------------------------------------------------------
# root
# ---------------------------------------------------------------------------------------------


def _root_scalar_cubic() -> Built:
    # x³ − a = 0, x 0-d: x* = a^(1/3).
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(x**3 - a, x, {"a": a}, 1.0)


def _root_vector_linear() -> Built:
    # (M + sI)x − b = 0 with a non-symmetric M: scalar, vector and matrix parameters.
    x = pt.vector("x", shape=(3,))
    s, b, M = pt.scalar("s"), pt.vector("b", shape=(3,)), pt.matrix("M", shape=(3, 3))
    return Built((M + s * pt.eye(3)) @ x - b, x, {"s": s, "b": b, "M": M}, np.zeros(3))


def _root_vector_linear_vjp(v, w):
    # u = K⁻ᵀw: ∂L/∂b = u, ∂L/∂M = −u x*ᵀ, ∂L/∂s = −uᵀx*.
    K = v["M"] + v["s"] * np.eye(3)
    x = np.linalg.solve(K, v["b"])
    u = np.linalg.solve(K.T, w)
    return {"s": -u @ x, "b": u, "M": -np.outer(u, x)}


def _root_matrix_sqrt() -> Built:
    # x @ x − C = 0, x a (2, 2) matrix: x* = the principal square root of C (near the guess).
    x, C = pt.matrix("x", shape=(2, 2)), pt.matrix("C", shape=(2, 2))
    return Built(x @ x - C, x, {"C": C}, np.eye(2))


def _root_matrix_sqrt_vjp(v, W):
    # dX X + X dX = dC. For symmetric X = Q diag(σ) Qᵀ that map is self-adjoint (Frobenius), so
    # ∂L/∂C = Z with Z X + X Z = W, i.e. Z = Q [(QᵀWQ)_ij / (σ_i + σ_j)] Qᵀ.
    sigma, Q = np.linalg.eigh(scipy.linalg.sqrtm(v["C"]).real)
    Z = (Q.T @ W @ Q) / (sigma[:, None] + sigma[None, :])
    return {"C": Q @ Z @ Q.T}


def _root_two_variables() -> Built:
    # x = [p (0-d), q (2,)], equations [eᵖ − c·Σq (0-d), q² − b (2,)]:
    # q* = √b, p* = log(c·S) with S = Σ√b.
    p, q = pt.scalar("p"), pt.vector("q", shape=(2,))
    c, b = pt.scalar("c"), pt.vector("b", shape=(2,))
    return Built([pt.exp(p) - c * q.sum(), q**2 - b], [p, q], {"c": c, "b": b}, [0.0, [1.0, 1.0]])


def _root_two_variables_vjp(v, w):
    # ∂p*/∂c = 1/c, ∂p*/∂b_i = (1/S)·∂q_i*/∂b_i, ∂q_i*/∂b_i = 1/(2√b_i).
    wp, wq = w
    sqrt_b = np.sqrt(v["b"])
    return {"c": wp / v["c"], "b": (wp / sqrt_b.sum() + wq) / (2 * sqrt_b)}


def _root_disconnected() -> Built:
    # exp(e)·(x − a)·(1 + d²) = 0: d and e only scale equations that vanish at x* = a.
    x = pt.vector("x", shape=(2,))
    a, d, e = pt.vector("a", shape=(2,)), pt.scalar("d"), pt.scalar("e")
    return Built(pt.exp(e) * (x - a) * (1 + d**2), x, {"a": a, "d": d, "e": e}, np.zeros(2))


def _root_shared_parameter() -> Built:
    # eᵃ·x − a = 0 (vector): x* = a·e⁻ᵃ; `a` enters twice, and the guess is an expression of it.
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    return Built(pt.exp(a) * x - a, x, {"a": a}, 0.5 * a)


def _root_integer_parameter() -> Built:
    # sinh(k·x[perm]) − a = 0 with integers k and perm used directly on x:
    # x*[perm] = arcsinh(a)/k.
    x, a = pt.vector("x", shape=(3,)), pt.vector("a", shape=(3,))
    k, perm = pt.scalar("k", dtype="int64"), pt.vector("perm", dtype="int64", shape=(3,))
    return Built(pt.sinh(k * x[perm]) - a, x, {"a": a, "k": k, "perm": perm}, np.zeros(3))


def _root_arcsin() -> Built:
    # sin(x) − a = 0 elementwise (diagonal Jacobian): x* = arcsin(a) from a guess at 0.
    x, a = pt.vector("x", shape=(4,)), pt.vector("a", shape=(4,))
    return Built(pt.sin(x) - a, x, {"a": a}, np.zeros(4))


def _root_problems() -> list[Problem]:
    rng = _rng()
    C_half = _spd_root(2, rng)
    return [
        Problem(
            "scalar_cubic",
            _root_scalar_cubic,
            {"a": np.array(3.0)},
            lambda v: np.cbrt(v["a"]),
            lambda v, w: {"a": w / (3 * np.cbrt(v["a"]) ** 2)},
        ),
        Problem(
            "vector_linear",
            _root_vector_linear,
            {"s": np.array(1.5), "b": rng.standard_normal(3), "M": _spd_root(3, rng)},
            lambda v: np.linalg.solve(v["M"] + v["s"] * np.eye(3), v["b"]),
            _root_vector_linear_vjp,
        ),
        Problem(
            "matrix_sqrt",
            _root_matrix_sqrt,
            {"C": C_half @ C_half.T + 0.5 * np.eye(2)},
            lambda v: scipy.linalg.sqrtm(v["C"]).real,
            _root_matrix_sqrt_vjp,
        ),
        Problem(
            "two_variables",
            _root_two_variables,
            {"c": np.array(0.8), "b": np.array([2.0, 0.5])},
            lambda v: [np.log(v["c"] * np.sqrt(v["b"]).sum()), np.sqrt(v["b"])],
            _root_two_variables_vjp,
        ),
        Problem(
            "disconnected",
            _root_disconnected,
            {"a": np.array([0.3, -1.2]), "d": np.array(0.4), "e": np.array(-0.3)},
            lambda v: v["a"],
            lambda v, w: {"a": w, "d": np.array(0.0), "e": np.array(0.0)},
            zero_gradient=("d", "e"),
        ),
        Problem(
            "shared_parameter",
            _root_shared_parameter,
            {"a": np.array([0.4, 1.1, -0.5])},
            lambda v: v["a"] * np.exp(-v["a"]),
            lambda v, w: {"a": w * (1 - v["a"]) * np.exp(-v["a"])},
        ),
        Problem(
            "integer_parameter",
            _root_integer_parameter,
            {
                "a": np.array([0.6, -0.9, 1.5]),
                "k": np.array(2, dtype="int64"),
                "perm": np.array([2, 0, 1], dtype="int64"),
            },
            lambda v: _integer_solution(v, np.arcsinh),
            lambda v, w: {"a": w[v["perm"]] / (v["k"] * np.sqrt(1 + v["a"] ** 2))},
        ),
        Problem(
            "arcsin",
            _root_arcsin,
            {"a": np.array([0.3, -0.5, 0.1, 0.7])},
            lambda v: np.arcsin(v["a"]),
            lambda v, w: {"a": w / np.sqrt(1 - v["a"] ** 2)},
        ),
    ]


# ---------------------------------------------------------------------------------------------
# minimize_scalar: objectives whose minimum value is 0 where possible, so that the derivative-free
# scalar minimizers can locate x* to ~1e-13 instead of the √eps of a flat nonzero minimum.
# ---------------------------------------------------------------------------------------------


def _ms_cube_root() -> Built:
    # (x³ − a)²: x* = a^(1/3).
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built((x**3 - a) ** 2, x, {"a": a}, 0.5)


def _ms_product() -> Built:
    # (x − a·b)²: x* = a·b, linear in each parameter (central differences are exact).
    x, a, b = pt.scalar("x"), pt.scalar("a"), pt.scalar("b")
    return Built((x - a * b) ** 2, x, {"a": a, "b": b}, 0.0)


def _ms_log_ratio() -> Built:
    # (log x − log a − b)²: x* = a·eᵇ.
    x, a, b = pt.scalar("x"), pt.scalar("a"), pt.scalar("b")
    return Built((pt.log(x) - pt.log(a) - b) ** 2, x, {"a": a, "b": b}, 1.0)


def _ms_shared_parameter() -> Built:
    # (eᵃ·x − a)²: x* = a·e⁻ᵃ.
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built((pt.exp(a) * x - a) ** 2, x, {"a": a}, 0.0)


def _ms_disconnected() -> Built:
    # eᵉ·(x − a)² + d²: neither d nor e moves x* = a.
    x, a, d, e = pt.scalar("x"), pt.scalar("a"), pt.scalar("d"), pt.scalar("e")
    return Built(pt.exp(e) * (x - a) ** 2 + d**2, x, {"a": a, "d": d, "e": e}, 0.0)


def _ms_integer_parameter() -> Built:
    # (k·x − a)² with an integer k used directly on x: x* = a/k.
    x, a, k = pt.scalar("x"), pt.scalar("a"), pt.scalar("k", dtype="int64")
    return Built((k * x - a) ** 2, x, {"a": a, "k": k}, 0.0)


MINIMIZE_SCALAR_PROBLEMS = [
    Problem(
        "cube_root",
        _ms_cube_root,
        {"a": np.array(3.0)},
        lambda v: np.cbrt(v["a"]),
        lambda v, w: {"a": w / (3 * np.cbrt(v["a"]) ** 2)},
        bracket=(0.5, 2.5),
    ),
    Problem(
        "product",
        _ms_product,
        {"a": np.array(0.8), "b": np.array(1.3)},
        lambda v: v["a"] * v["b"],
        lambda v, w: {"a": w * v["b"], "b": w * v["a"]},
        bracket=(-1.0, 3.0),
    ),
    Problem(
        "log_ratio",
        _ms_log_ratio,
        {"a": np.array(1.3), "b": np.array(0.4)},
        lambda v: v["a"] * np.exp(v["b"]),
        lambda v, w: {"a": w * np.exp(v["b"]), "b": w * v["a"] * np.exp(v["b"])},
        bracket=(0.5, 4.0),
    ),
    Problem(
        "shared_parameter",
        _ms_shared_parameter,
        {"a": np.array(0.7)},
        lambda v: v["a"] * np.exp(-v["a"]),
        lambda v, w: {"a": w * (1 - v["a"]) * np.exp(-v["a"])},
        bracket=(-1.0, 2.0),
    ),
    Problem(
        "disconnected",
        _ms_disconnected,
        # d small: the minimum value d² stays ~0, so that brent still resolves x* to ~1e-11
        # (a value of 0.16 would limit it to ~5e-9).
        {"a": np.array(0.3), "d": np.array(1e-3), "e": np.array(-0.3)},
        lambda v: v["a"],
        lambda v, w: {"a": w, "d": np.array(0.0), "e": np.array(0.0)},
        zero_gradient=("d", "e"),
        bracket=(-2.0, 2.0),
        # x* = a is linear in every parameter, so central differences are exact for any step;
        # 1e-2 divides the ~1e-11 solver noise (moving d moves the minimum value) by 1e-2.
        fd_step=1e-2,
    ),
    Problem(
        "integer_parameter",
        _ms_integer_parameter,
        {"a": np.array(0.9), "k": np.array(3, dtype="int64")},
        lambda v: v["a"] / v["k"],
        lambda v, w: {"a": w / v["k"]},
        bracket=(-1.0, 2.0),
    ),
]


# ---------------------------------------------------------------------------------------------
# root_scalar
# ---------------------------------------------------------------------------------------------


def _rs_cube_root() -> Built:
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(x**3 - a, x, {"a": a}, 1.0)


def _rs_log() -> Built:
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(pt.exp(x) - a, x, {"a": a}, 0.0)


def _rs_arctanh() -> Built:
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(pt.tanh(x) - a, x, {"a": a}, 0.0)


def _rs_product() -> Built:
    # x² − a·b = 0: x* = √(ab), two parameters in one term.
    x, a, b = pt.scalar("x"), pt.scalar("a"), pt.scalar("b")
    return Built(x**2 - a * b, x, {"a": a, "b": b}, 1.0)


def _rs_shared_parameter() -> Built:
    x, a = pt.scalar("x"), pt.scalar("a")
    return Built(pt.exp(a) * x - a, x, {"a": a}, 0.0)


def _rs_disconnected() -> Built:
    # eᵉ·(x − a)·(1 + d²): d and e scale an equation that vanishes at x* = a.
    x, a, d, e = pt.scalar("x"), pt.scalar("a"), pt.scalar("d"), pt.scalar("e")
    return Built(pt.exp(e) * (x - a) * (1 + d**2), x, {"a": a, "d": d, "e": e}, 0.0)


def _rs_integer_parameter() -> Built:
    # k·x − sin(a) with an integer k used directly on x: x* = sin(a)/k.
    x, a, k = pt.scalar("x"), pt.scalar("a"), pt.scalar("k", dtype="int64")
    return Built(k * x - pt.sin(a), x, {"a": a, "k": k}, 0.0)


ROOT_SCALAR_PROBLEMS = [
    Problem(
        "cube_root",
        _rs_cube_root,
        {"a": np.array(3.0)},
        lambda v: np.cbrt(v["a"]),
        lambda v, w: {"a": w / (3 * np.cbrt(v["a"]) ** 2)},
        bracket=(0.0, 3.0),
    ),
    Problem(
        "log",
        _rs_log,
        {"a": np.array(2.5)},
        lambda v: np.log(v["a"]),
        lambda v, w: {"a": w / v["a"]},
        bracket=(-2.0, 3.0),
    ),
    Problem(
        "arctanh",
        _rs_arctanh,
        {"a": np.array(0.6)},
        lambda v: np.arctanh(v["a"]),
        lambda v, w: {"a": w / (1 - v["a"] ** 2)},
        bracket=(-2.0, 3.0),
    ),
    Problem(
        "product",
        _rs_product,
        {"a": np.array(1.5), "b": np.array(2.2)},
        lambda v: np.sqrt(v["a"] * v["b"]),
        lambda v, w: {
            "a": w * v["b"] / (2 * np.sqrt(v["a"] * v["b"])),
            "b": w * v["a"] / (2 * np.sqrt(v["a"] * v["b"])),
        },
        bracket=(0.0, 4.0),
    ),
    Problem(
        "shared_parameter",
        _rs_shared_parameter,
        {"a": np.array(0.7)},
        lambda v: v["a"] * np.exp(-v["a"]),
        lambda v, w: {"a": w * (1 - v["a"]) * np.exp(-v["a"])},
        bracket=(-1.0, 2.0),
    ),
    Problem(
        "disconnected",
        _rs_disconnected,
        {"a": np.array(0.3), "d": np.array(0.4), "e": np.array(-0.3)},
        lambda v: v["a"],
        lambda v, w: {"a": w, "d": np.array(0.0), "e": np.array(0.0)},
        zero_gradient=("d", "e"),
        bracket=(-2.0, 2.0),
    ),
    Problem(
        "integer_parameter",
        _rs_integer_parameter,
        {"a": np.array(0.9), "k": np.array(3, dtype="int64")},
        lambda v: np.sin(v["a"]) / v["k"],
        lambda v, w: {"a": w * np.cos(v["a"]) / v["k"]},
        bracket=(-1.0, 2.0),
    ),
]

MINIMIZE_PROBLEMS = _minimize_problems()
ROOT_PROBLEMS = _root_problems()


def by_name(problems: Sequence[Problem], name: str) -> Problem:
    (problem,) = [p for p in problems if p.name == name]
    return problem


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def as_list(x) -> list:
    return list(x) if isinstance(x, list | tuple) else [x]


def loss_weights(solution, seed: int = 0) -> list[np.ndarray]:
    """Fixed random weights w shaped like x*, for the loss L = Σ w ⊙ x* (every entry counts)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 1.5, size=np.shape(s)) for s in as_list(solution)]


def weighted_loss(x_star, weights: Sequence[np.ndarray]) -> pt.TensorVariable:
    """Symbolic L = Σ w ⊙ x* over every piece of x*."""
    return sum(pt.sum(pt.as_tensor(w) * xs) for xs, w in zip(as_list(x_star), weights, strict=True))


def unlist(values: list, like):
    """Return `values` as a list when `like` is a list, else its single element."""
    return list(values) if isinstance(like, list | tuple) else values[0]


def central_difference(
    loss: Callable[[dict], float], values: dict, name: str, step: float
) -> np.ndarray:
    """∂loss/∂values[name] by central differences, entry by entry, with an absolute step."""
    base = np.asarray(values[name], dtype="float64")
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        shifted = []
        for sign in (1.0, -1.0):
            moved = base.copy()
            moved[idx] += sign * step
            shifted.append(loss({**values, name: moved}))
        grad[idx] = (shifted[0] - shifted[1]) / (2 * step)
    return grad


def fast_function(inputs, outputs):
    """A pytensor function compiled without C code: cheap to build, for reference callbacks."""
    return pytensor.function(inputs, outputs, mode="FAST_COMPILE", on_unused_input="ignore")


class CompiledSolve:
    """One compiled function giving x*, success and ∂L/∂θ (L = Σ w ⊙ x*) for a problem.

    Compilation dominates the test time, so each (problem, solver call) is compiled once and
    evaluated many times (at θ, and at the shifted θ of the finite differences).

    Parameters
    ----------
    problem : Problem
    solve : Built -> (x_star, success), the solver call under test.
    """

    def __init__(self, problem: Problem, solve: Callable[[Built], tuple]):
        self.problem = problem
        self.built = problem.build()
        x_star, success = solve(self.built)
        self.is_list = isinstance(x_star, list | tuple)
        self.weights = loss_weights(problem.solution(problem.values))
        self.names = list(self.built.params)
        float_vars = [self.built.params[n] for n in problem.float_names]
        grads = pt.grad(weighted_loss(x_star, self.weights), float_vars)
        self.fn = pytensor.function(
            [self.built.params[n] for n in self.names], [*as_list(x_star), success, *grads]
        )
        self.n_x = len(as_list(x_star))

    @property
    def w(self):
        """The loss weights, shaped like x* (a list when `x` is a list)."""
        return self.weights if self.is_list else self.weights[0]

    def __call__(self, values: dict | None = None):
        """Return (x_star as a list, success, {name: gradient})."""
        values = self.problem.values if values is None else values
        outs = self.fn(*[values[n] for n in self.names])
        x_star = outs[: self.n_x]
        grads = dict(zip(self.problem.float_names, outs[self.n_x + 1 :], strict=True))
        return x_star, bool(outs[self.n_x]), grads

    def loss_value(self, values: dict) -> float:
        x_star, success, _ = self(values)
        assert success, f"solver failed at shifted parameters {values}"
        return float(sum(np.sum(w * x) for w, x in zip(self.weights, x_star, strict=True)))

    def finite_difference(self, name: str, step: float) -> np.ndarray:
        return central_difference(self.loss_value, self.problem.values, name, step)

    def expected_solution(self) -> list[np.ndarray]:
        return as_list(self.problem.solution(self.problem.values))

    def expected_gradients(self) -> dict[str, np.ndarray]:
        return self.problem.vjp(self.problem.values, self.w)


_COMPILED: dict[tuple, CompiledSolve] = {}


def compiled_solve(key: tuple, problem: Problem, solve: Callable[[Built], tuple]) -> CompiledSolve:
    """`CompiledSolve(problem, solve)`, cached under `key` for the whole test session."""
    key = (problem.name, *key)
    if key not in _COMPILED:
        _COMPILED[key] = CompiledSolve(problem, solve)
    return _COMPILED[key]


def numeric_x0(built: Built, values: dict) -> list[np.ndarray]:
    """The initial guess as arrays (evaluating it when it is an expression of the parameters)."""
    x0s = as_list(built.x0) if isinstance(built.x, list | tuple) else [built.x0]
    out = []
    for x0, x in zip(x0s, as_list(built.x), strict=True):
        x0 = pt.as_tensor(x0)
        inputs = [v for n, v in built.params.items() if v in pytensor.graph.ancestors([x0])]
        value = x0.eval({v: values[n] for n, v in built.params.items() if v in inputs})
        out.append(np.broadcast_to(np.asarray(value, dtype="float64"), x.type.shape).copy())
    return out


class FlatProblem:
    """The problem's outputs rewritten on one flat float64 vector z (x pieces are slices of z).

    Used to call scipy directly with the same objective or equations, independently of the
    package's own packing code.
    """

    def __init__(self, built: Built):
        self.built = built
        self.xs = as_list(built.x)
        self.shapes = [x.type.shape for x in self.xs]
        self.sizes = [int(np.prod(s, dtype=int)) for s in self.shapes]
        self.z = pt.vector("z", shape=(sum(self.sizes),))
        pieces, start = [], 0
        for size, shape in zip(self.sizes, self.shapes, strict=True):
            pieces.append(self.z[start : start + size].reshape(shape))
            start += size
        self.replace = dict(zip(self.xs, pieces, strict=True))
        self.params = list(built.params.values())

    def rewrite(self, outputs):
        return clone_replace(outputs, replace=self.replace)

    def compile(self, outputs, extra_inputs=()):
        """`outputs` (of z, `extra_inputs` and the parameters) as ``f(values, z, *extra)``."""
        fn = fast_function([self.z, *extra_inputs, *self.params], outputs)
        names = list(self.built.params)

        def call(values, z, *extra):
            return fn(z, *extra, *[values[n] for n in names])

        return call

    def pack(self, arrays) -> np.ndarray:
        return np.concatenate([np.asarray(a, dtype="float64").ravel() for a in arrays])

    def unpack(self, z) -> list[np.ndarray]:
        out, start = [], 0
        for size, shape in zip(self.sizes, self.shapes, strict=True):
            out.append(np.asarray(z[start : start + size]).reshape(shape))
            start += size
        return out


# ---------------------------------------------------------------------------------------------
# the checks every solver's tests run
# ---------------------------------------------------------------------------------------------


def check_value(c: CompiledSolve, atol: float) -> None:
    """The solver succeeds and x* has the closed-form value (and `x`'s shapes)."""
    x_star, success, _ = c()
    assert success
    for got, expected in zip(x_star, c.expected_solution(), strict=True):
        assert got.shape == np.shape(expected)
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def check_gradient_closed_form(c: CompiledSolve, atol: float, rtol: float = 1e-7) -> None:
    """∂L/∂θ equals the closed-form pullback for every float parameter, shaped like θ."""
    _, _, grads = c()
    expected = c.expected_gradients()
    assert set(grads) == set(expected)
    for name, grad in grads.items():
        assert grad.shape == np.shape(c.problem.values[name])
        np.testing.assert_allclose(grad, expected[name], rtol=rtol, atol=atol, err_msg=name)


def check_gradient_finite_differences(
    c: CompiledSolve, step: float, atol: float, rtol: float = 1e-6
) -> None:
    """∂L/∂θ equals central finite differences of L(x*(θ)) for every float parameter."""
    _, _, grads = c()
    for name, grad in grads.items():
        fd = c.finite_difference(name, step)
        np.testing.assert_allclose(grad, fd, rtol=rtol, atol=atol, err_msg=name)


# --- a Laplace marginal to solve many times (warm starts) -----------------------------------------
def poisson_intercepts(n_groups=30, per_group=5, seed=3):
    """y ~ Poisson(exp(mu + u_g)), u ~ N(0, sigma): the model users marginalize."""
    import pymc as pm

    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(n_groups), per_group)
    y = rng.poisson(np.exp(0.5 + rng.normal(0.0, 0.7, n_groups)[group]))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        u = pm.Normal("u", 0.0, sigma, shape=n_groups)
        pm.Poisson("y", pm.math.exp(mu + u[group]), observed=y)
    return model


def newton_node(model):
    from pytensor.graph.traversal import ancestors

    from pymc_optim.backends.newton import NewtonOp

    (node,) = {
        v.owner
        for v in ancestors(model.potentials)
        if v.owner is not None and isinstance(v.owner.op, NewtonOp)
    }
    return node


def warm_history(fn) -> list:
    """The warm-start history, (θ, x*) of the last successful solves, of the one NewtonOp node
    of the compiled `fn` (a PyTensor function, or PyMC's wrappers of one) in this thread."""
    from pymc_optim.backends.newton import NewtonOp
    from pymc_optim.graph.solver_op import solve_state

    for attribute in ("_pytensor_function", "f"):
        fn = getattr(fn, attribute, fn)
    (node,) = [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, NewtonOp)]
    return solve_state(node).setdefault("warm_start", [])


def counters(model, mode=None):
    """A function of θ (the value variables) returning the inner solve's (success, iterations,
    evaluations), with the marginal's Op (and its own warm-start history)."""
    node = newton_node(model)
    k = node.op.n_controls
    outs = model.replace_rvs_by_values(node.outputs[k : k + 3])
    return pytensor.function(model.value_vars, outs, on_unused_input="ignore", mode=mode)


def theta_point(model, mu, log_sigma):
    return {"mu": np.asarray(mu), "sigma_log__": np.asarray(log_sigma)}


def raveled(model, mu, log_sigma):
    point = theta_point(model, mu, log_sigma)
    return np.array([point[v.name] for v in model.value_vars])
