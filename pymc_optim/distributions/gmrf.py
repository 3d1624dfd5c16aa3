"""Scalable Gaussian Markov random fields: an edge-list ICAR and a sparse-precision GMRF.

PyMC's ``pm.ICAR`` needs a dense N × N adjacency matrix and omits the −(N − c) log σ term of its
density (its docstring asks to keep σ = 1), so it serves neither N = 10⁵ nor a free σ. The two
distributions here take a graph as an edge list or a scipy sparse matrix, never build a dense
matrix, and their log densities are normalised:

- :class:`ICAR` — intrinsic conditional autoregression on a graph with edge weights w_ij,
  precision Q = L / σ² with L = D − W the weighted graph Laplacian (rank N − c for c connected
  components), and the constraint that the field sums to zero on each component (INLA's
  ``constr=TRUE``), handled exactly or softly;
- :class:`GMRF` — a proper Gaussian N(μ, (τ Q)⁻¹) with a fixed sparse precision Q;
- :class:`RW` — the first- or second-order random walk (RW1/RW2) of a series, an intrinsic GMRF
  with banded precision DᵀD/σ², anchored at its first values.

Log-densities cost O(number of edges); log det terms of the fixed matrices are computed once,
when the variable is created, with the sparse Cholesky of :mod:`pymc_optim.linalg.sparse`
(optional extra ``sparse``); draws go through the same factor.

Why here: ``pymc_optim/model/`` holds helpers that transform a ``pm.Model`` (Laplace
marginalization, agents); a distribution is a building block placed *in* a model, so it lives in
``pymc_optim/distributions/``, mirroring ``pymc.distributions``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.distributions.dist_math import check_parameters
from pymc.logprob.transforms import Transform
from pymc.pytensorf import floatX
from pytensor.tensor.variable import TensorVariable

from pymc_optim.linalg import _cholesky
from pymc_optim.linalg.sparse import SparseFactorSolveOp, SparsePattern

__all__ = [
    "GMRF",
    "ICAR",
    "RW",
    "ComponentZeroSumTransform",
    "NullSpaceTransform",
    "bym2_scaling_factor",
]

_LOG_2PI = float(np.log(2 * np.pi))


class ICAR:
    r"""Intrinsic CAR (ICAR) field on a graph given by an edge list or a sparse adjacency.

    .. math::

        \log p(x \mid \sigma) = -\frac{1}{2\sigma^2} \sum_{(i,j) \in E} w_{ij} (x_i - x_j)^2
            - (N - c) \log\sigma + \tfrac12 \log{\det}^{*} L - \tfrac{N - c}{2} \log 2\pi

    on the subspace where the field sums to zero on each of the c connected components
    (``constraint="sum_to_zero"``), where :math:`{\det}^{*} L` is the product of the non-zero
    eigenvalues of the weighted graph Laplacian L = D − W (by the matrix-tree theorem,
    :math:`\prod_k n_k \det L_{k,\hat r \hat r}` with one node removed per component; computed
    once). This is the density of N(0, σ² L⁺) with respect to the Lebesgue measure of that
    subspace, normalised, so σ can be a free parameter.

    Parameters
    ----------
    name : str
        Name of the variable (``ICAR.dist(...)`` takes no name).
    edges : array_like of int, shape (E, 2), optional
        Each undirected edge once, as a pair of node indices. Give ``edges`` or ``adjacency``.
    adjacency : scipy.sparse matrix or numpy.ndarray, shape (N, N), optional
        Symmetric, non-negative, zero diagonal; its non-zeros are the edge weights.
    weights : array_like, shape (E,), optional
        Positive edge weights for ``edges`` (default 1).
    n : int, optional
        Number of nodes for ``edges`` (default: the largest index + 1).
    sigma : tensor_like of float, default 1
        Scale: the precision is L / σ².
    constraint : {"sum_to_zero", "soft", "corner"}, default "sum_to_zero"
        ``"sum_to_zero"``: the value lives on the constrained subspace, sampled through
        :class:`ComponentZeroSumTransform` (N − c free coordinates); the density above exactly.
        ``"soft"``: the value is unconstrained in ℝᴺ with an extra Gaussian penalty on each
        component's sum s_k, −s_k² / (2 ε² n_k²) (PyMC's ``pm.ICAR`` form, ε = ``epsilon``),
        normalised: the proper Gaussian with precision L/σ² + Σ_k a_k a_kᵀ / (ε² n_k²)
        (a_k = the indicator of component k), whose log det adds −Σ_k log(ε² n_k).
        ``"corner"``: the value is zero at each component's root (its lowest-numbered node) and
        free elsewhere (N − c coordinates): the proper N(0, σ² L_{r̂r̂}⁻¹) of the other nodes,
        log det L_{r̂r̂} = log det* L − Σ_k log n_k. The same model as ``"sum_to_zero"`` up to a
        shift of each component absorbed by an intercept, and the one whose Hessian stays
        sparse in the free coordinates (use :meth:`ICAR.hessian_structure` with
        ``marginalize_laplace``).
    epsilon : float, default 0.001
        Scale of the soft constraint (the standard deviation of a component's mean is ε).
    islands : {"error", "per_component"}, default "error"
        A graph with several connected components gets one sum-to-zero constraint per
        component with ``"per_component"`` (INLA's convention); by default it is an error,
        since a disconnected adjacency is more often a mistake than a design.
    **kwargs
        Passed to ``pm.CustomDist`` (``dims``, ``observed``, ``initval``, ...).

    Returns
    -------
    TensorVariable
        The field, shape (N,).

    Raises
    ------
    ValueError
        Non-symmetric or negative adjacency, self-loops, repeated edges, indices out of range,
        an isolated node (no neighbour: its value would have no distribution), or islands with
        ``islands="error"``.

    Notes
    -----
    Draws (``pm.draw``, prior predictive) are exact: fixing one root node r per component, the
    differences x − x_r have the proper precision L_{r̂r̂}/σ² (the Laplacian without the roots'
    rows and columns), drawn through its sparse Cholesky factor and centred per component,
    which gives covariance σ² L⁺ (Π G Π = L⁺ for G the inverse of the grounded Laplacian
    embedded with zero rows at the roots, Π the per-component centring).

    Examples
    --------
    >>> import pymc as pm
    >>> from pymc_optim.distributions.gmrf import ICAR
    >>> edges = [(0, 1), (1, 2), (2, 3), (3, 0)]  # a 4-cycle
    >>> with pm.Model(coords={"area": list("abcd")}) as model:
    ...     sigma = pm.HalfNormal("sigma")
    ...     phi = ICAR("phi", edges=edges, sigma=sigma, dims="area")
    >>> pm.draw(phi, random_seed=1).shape
    (4,)
    >>> bool(abs(pm.draw(phi, random_seed=1).sum()) < 1e-12)
    True
    """

    def __new__(cls, name: str, edges=None, **kwargs) -> TensorVariable:
        graph, sigma, kwargs = _icar_arguments(edges, **kwargs)
        if graph.constraint == "sum_to_zero":
            kwargs.setdefault("transform", ComponentZeroSumTransform(graph.component, graph.roots))
        elif graph.constraint == "corner":
            kwargs.setdefault("transform", _CornerTransform(graph.n, graph.free))
        return pm.CustomDist(name, sigma, **_icar_custom_dist_kwargs(graph), **kwargs)

    @classmethod
    def dist(cls, edges=None, **kwargs) -> TensorVariable:
        """The unnamed distribution (for ``pm.logp``, ``pm.draw``); same arguments as ``ICAR``."""
        graph, sigma, kwargs = _icar_arguments(edges, **kwargs)
        return pm.CustomDist.dist(sigma, **_icar_custom_dist_kwargs(graph), **kwargs)

    @staticmethod
    def hessian_structure(edges=None, *, adjacency=None, n: int | None = None, islands="error"):
        """The :class:`~pymc_optim.linalg.sparse.SparseStructure` of the Laplace Hessian of a
        ``constraint="corner"`` ICAR with an element-wise likelihood, in its free coordinates
        (the grounded Laplacian's pattern plus the diagonal): pass it as ``hessian_structure``
        of ``marginalize_laplace``."""
        from pymc_optim.linalg.sparse import SparseStructure

        graph = _icar_graph(edges, adjacency, None, n, "corner", 1e-3, islands)
        return SparseStructure(pattern=graph.grounded)


class GMRF:
    r"""Proper Gaussian Markov random field N(μ, (τ Q)⁻¹) with a fixed sparse precision Q.

    .. math::

        \log p(x) = -\frac{\tau}{2} (x - \mu)^\top Q (x - \mu) + \frac{N}{2}\log\tau
            + \frac12 \log\det Q - \frac{N}{2}\log 2\pi

    with log det Q computed once by the sparse Cholesky factorization. The quadratic form costs
    O(nnz(Q)); no dense matrix is formed.

    Parameters
    ----------
    name : str
        Name of the variable.
    precision : scipy.sparse matrix, shape (N, N)
        Symmetric positive definite (checked once, by its Cholesky factorization).
    mu : tensor_like of float, shape () or (N,), default 0
    tau : tensor_like of float, default 1
        Precision scale.
    **kwargs
        Passed to ``pm.CustomDist`` (``dims``, ``observed``, ...).

    Raises
    ------
    TypeError
        If ``precision`` is not a scipy sparse matrix.
    ValueError
        If ``precision`` is not square, not symmetric, or not positive definite (for an
        intrinsic precision such as a graph Laplacian use :class:`ICAR`).

    Examples
    --------
    >>> import numpy as np, pymc as pm, scipy.sparse as sp
    >>> from pymc_optim.distributions.gmrf import GMRF
    >>> Q = sp.diags([-1.0, 2.1, -1.0], [-1, 0, 1], shape=(5, 5))  # an AR(1)-like chain
    >>> x = GMRF.dist(precision=Q, mu=1.0)
    >>> pm.draw(x, random_seed=0).shape
    (5,)
    """

    def __new__(cls, name: str, precision, *, mu=0.0, tau=1.0, **kwargs) -> TensorVariable:
        _one_field("GMRF", np.shape(precision)[0], kwargs)
        return pm.CustomDist(
            name,
            floatX(mu),
            _scalar("GMRF", "tau", tau),
            **_gmrf_custom_dist_kwargs(precision),
            **kwargs,
        )

    @classmethod
    def dist(cls, precision, *, mu=0.0, tau=1.0, **kwargs) -> TensorVariable:
        """The unnamed distribution; same arguments as ``GMRF``."""
        _one_field("GMRF", np.shape(precision)[0], kwargs)
        return pm.CustomDist.dist(
            floatX(mu),
            _scalar("GMRF", "tau", tau),
            **_gmrf_custom_dist_kwargs(precision),
            **kwargs,
        )


class RW:
    r"""First- or second-order random walk (RW1, RW2) of a series, anchored at its start.

    .. math::

        \log p(x \mid \sigma) = -\frac{1}{2\sigma^2} \sum_{t=k}^{N-1} (\Delta^k x)_t^2
            - (N - k) \log\sigma - \tfrac{N - k}{2} \log 2\pi,
        \qquad x_0 = \dots = x_{k-1} = 0,

    with Δ the difference operator and k = `order`: Δx_t = x_t − x_{t−1} (RW1),
    Δ²x_t = x_t − 2x_{t−1} + x_{t−2} (RW2). The precision DᵀD/σ² of the intrinsic random walk
    has rank N − k (its null space: constants, and for RW2 also linear trends); fixing the first
    k values (through a transform: N − k free coordinates) makes it the proper Gaussian whose
    differences are iid N(0, σ²), with a unit-determinant (triangular) D in the free values, so
    the density above is normalised and σ can be free. The model equals INLA's constrained
    RW1/RW2 up to an intercept (RW1), or an intercept and a linear trend (RW2), which the model
    should then carry. The log density costs O(N); its Hessian is banded (bandwidth k), so
    ``marginalize_laplace`` takes the sparse layout by itself for N ≥ 256.

    Parameters
    ----------
    name : str
    n : int
        Length of the series (N > `order`).
    order : {1, 2}, default 1
    sigma : tensor_like of float, default 1
        Standard deviation of the k-th differences.
    constraint : {"anchored", "sum_to_zero"}, default "anchored"
        ``"anchored"``: x_0 = … = x_{k−1} = 0, as above. ``"sum_to_zero"``: the walk is
        orthogonal to the null space of DᵀD, A x = 0 with A's rows the constant and, for RW2,
        the (centred) linear trend: INLA's ``constr=TRUE`` (plus, for RW2, the linear
        constraint INLA leaves to ``extraconstr``), so the density is N(0, σ² (DᵀD)⁺) on that
        (N − k)-dimensional subspace, normalised with ½ log det*(DᵀD)
        (= ``½ log det(AAᵀ) − log |det A_R|``, R the first k indices). It is sampled through
        :class:`NullSpaceTransform`, and :func:`pymc_optim.marginalize_laplace` integrates over
        the subspace exactly by conditioning by kriging, keeping H sparse. The same model as
        ``"anchored"`` up to an intercept (and a linear trend), which the model should carry.
    **kwargs
        Passed to ``pm.CustomDist`` (``dims``, ``observed``, ...).

    Returns
    -------
    TensorVariable
        The series, shape (N,).

    Raises
    ------
    ValueError
        If `order` is not 1 or 2, `n` is not larger than `order`, or `constraint` is unknown.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> from pymc_optim.distributions.gmrf import RW
    >>> x = RW.dist(n=6, order=2, sigma=0.5)
    >>> draw = pm.draw(x, random_seed=2)
    >>> draw[:2].tolist(), draw.shape
    ([0.0, 0.0], (6,))
    """

    def __new__(
        cls, name: str, n: int, *, order: int = 1, sigma=1.0, constraint="anchored", **kwargs
    ) -> TensorVariable:
        n, order = _check_rw(n, order, constraint)
        _one_field("RW", n, kwargs)
        if constraint == "anchored":
            kwargs.setdefault("transform", _CornerTransform(n, np.arange(order, n)))
        else:
            kwargs.setdefault(
                "transform", NullSpaceTransform(_rw_null_space(n, order), np.arange(order))
            )
        return pm.CustomDist(
            name,
            _scalar("RW", "sigma", sigma),
            **_rw_custom_dist_kwargs(n, order, constraint),
            **kwargs,
        )

    @classmethod
    def dist(
        cls, n: int, *, order: int = 1, sigma=1.0, constraint="anchored", **kwargs
    ) -> TensorVariable:
        """The unnamed distribution (for ``pm.logp``, ``pm.draw``); same arguments as ``RW``."""
        n, order = _check_rw(n, order, constraint)
        _one_field("RW", n, kwargs)
        return pm.CustomDist.dist(
            _scalar("RW", "sigma", sigma), **_rw_custom_dist_kwargs(n, order, constraint), **kwargs
        )


def bym2_scaling_factor(
    edges=None,
    *,
    adjacency=None,
    weights=None,
    n: int | None = None,
    per_component: bool = False,
) -> float | np.ndarray:
    r"""The BYM2 scaling factor of an ICAR: the geometric mean of its marginal variances.

    .. math::

        s = \exp\Big(\frac{1}{N} \sum_i \log (L^{+})_{ii}\Big)

    with L = D − W the weighted graph Laplacian and L⁺ its generalized inverse, the covariance
    of a unit-scale ICAR that sums to zero on each connected component. Dividing the ICAR by
    √s gives it unit generalized variance, so that in the BYM2 field
    σ (√(ρ/s) φ + √(1 − ρ) θ) the mixing weight ρ is the share of the variance that is spatial
    (Riebler et al. 2016). Computed sparsely and exactly: no N × N matrix is formed.

    Parameters
    ----------
    edges : array_like of int, shape (E, 2), optional
        Each undirected edge once, as a pair of node indices. Give ``edges`` or ``adjacency``.
    adjacency : scipy.sparse matrix or numpy.ndarray, shape (N, N), optional
        Symmetric, non-negative, zero diagonal; its non-zeros are the edge weights.
    weights : array_like, shape (E,), optional
        Positive edge weights for ``edges`` (default 1).
    n : int, optional
        Number of nodes for ``edges`` (default: the largest index + 1).
    per_component : bool, default False
        False: one factor, the geometric mean over every node that has a neighbour. True: one
        factor per connected component, returned per node (each component scaled on its own,
        as R-INLA's ``scale.model`` does for a disconnected graph; Freni-Sterrantino et al.
        2018); an isolated node gets 1.

    Returns
    -------
    scaling_factor : float or numpy.ndarray of shape (N,)
        s; or, with ``per_component=True``, s of each node's component.

    Raises
    ------
    ValueError
        As :class:`ICAR` for a malformed graph (asymmetric or negative adjacency, self-loops,
        repeated edges, indices out of range, no edge). Isolated nodes and several components
        are allowed here: an isolated node's variance under the sum-to-zero constraint is 0,
        so it is left out of the geometric mean.

    Notes
    -----
    For a component with root r (its lowest-numbered node) and n_k nodes, let G be the inverse
    of the grounded Laplacian L_{r̂r̂}, embedded with a zero row and column at r. Then
    L⁺ = Π G Π with Π = I − 11ᵀ/n_k the centring (the ICAR's Notes), so

    .. math::

        (L^{+})_{ii} = G_{ii} - \frac{2}{n_k} (G\mathbf{1})_i
            + \frac{1}{n_k^2} \mathbf{1}^\top G \mathbf{1},

    exact, from one sparse Cholesky factorization of the grounded Laplacian (the one
    :class:`ICAR` computes for its normalising constant): diag(G) by the selected inverse
    (Takahashi recurrences, on the factor's pattern only) and G1 by one solve. Its cost is
    that of the factorization, O(N^{3/2}) for a planar graph; memory is the factor's.

    References
    ----------
    Riebler, A., Sørbye, S. H., Simpson, D. and Rue, H. (2016). An intuitive Bayesian spatial
    model for disease mapping that accounts for scaling. Statistical Methods in Medical
    Research 25(4), 1145–1165.

    Freni-Sterrantino, A., Ventrucci, M. and Rue, H. (2018). A note on intrinsic conditional
    autoregressive models for disconnected graphs. Spatial and Spatio-temporal Epidemiology
    26, 25–34.

    Examples
    --------
    A path of three nodes: L⁺ has diagonal (5, 2, 5)/9, so s = (50/729)^(1/3).

    >>> import numpy as np
    >>> from pymc_optim.distributions import bym2_scaling_factor
    >>> s = bym2_scaling_factor([(0, 1), (1, 2)])
    >>> bool(np.isclose(s, (50 / 729) ** (1 / 3), rtol=1e-12))
    True

    Two components, a path and a triangle, each scaled on its own:

    >>> bym2_scaling_factor([(0, 1), (1, 2), (3, 4), (4, 5), (3, 5)], per_component=True).round(4)
    array([0.4093, 0.4093, 0.4093, 0.2222, 0.2222, 0.2222])
    """
    if (edges is None) == (adjacency is None):
        raise ValueError("Give exactly one of `edges` (an (E, 2) index array) or `adjacency`.")
    if adjacency is not None:
        if weights is not None or n is not None:
            raise ValueError(
                "`weights` and `n` go with `edges`; `adjacency` carries both. Drop them."
            )
        n, i, j, w = _edges_from_adjacency(adjacency)
        if i.size == 0:
            raise ValueError("`adjacency` has no edge: an ICAR needs a graph with one at least.")
    else:
        n, i, j, w = _check_edges(edges, weights, n)
    graph = _Graph(n, i, j, w, "sum_to_zero", 1e-3)
    variances = _icar_marginal_variances(graph)
    connected = graph.sizes[graph.component] > 1
    if not per_component:
        return float(np.exp(np.log(variances[connected]).mean()))
    logs = np.bincount(
        graph.component[connected],
        weights=np.log(variances[connected]),
        minlength=graph.n_components,
    )
    factors = np.exp(logs / graph.sizes)
    factors[graph.sizes == 1] = 1.0  # an isolated node: no ICAR variance to scale
    return factors[graph.component]


def _rw_null_space(n: int, order: int) -> np.ndarray:
    """The (order, n) basis of the null space of DᵀD: constants (and a centred, scaled linear
    trend for RW2), the rows of the constraint A x = 0 of ``constraint="sum_to_zero"``."""
    rows = [np.ones(n)]
    if order == 2:
        rows.append((np.arange(n) - (n - 1) / 2) / n)
    return np.vstack(rows)


def _check_rw(n, order, constraint="anchored"):
    if constraint not in ("anchored", "sum_to_zero"):
        raise ValueError(
            f'`constraint` must be "anchored" or "sum_to_zero"; got {constraint!r}. A random '
            "walk without a constraint is improper (flat along constants and, for RW2, lines)."
        )
    if order not in (1, 2):
        raise ValueError(f"`order` must be 1 (RW1) or 2 (RW2); got {order!r}.")
    if not isinstance(n, int | np.integer) or n <= order:
        raise ValueError(
            f"`n` must be an integer larger than `order` ({order}): the walk is anchored at its "
            f"first {order} value(s); got {n!r}."
        )
    return int(n), int(order)


def _rw_custom_dist_kwargs(n: int, order: int, constraint: str = "anchored") -> dict:
    free = n - order
    log_pdet = 0.0  # anchored: D on the free values is unit triangular
    if constraint == "sum_to_zero":
        # det* DᵀD = det (DᵀD)_FF · det(AAᵀ) / det(A_R)² with R the first `order` values, where
        # (DᵀD)_FF has determinant 1 (as above) and the rows of A span the null space
        a = _rw_null_space(n, order)
        log_pdet = float(
            np.linalg.slogdet(a @ a.T)[1] - 2 * np.log(abs(np.linalg.det(a[:, :order])))
        )

    def logp(value, sigma):
        _check_length("RW", value, n)
        # the N − k differences Δᵏx_t, t ≥ k (the anchors x_0..x_{k−1} are the transform's zeros)
        differences = value[..., 1:] - value[..., :-1]
        if order == 2:
            differences = differences[..., 1:] - differences[..., :-1]
        logp = (
            -0.5 * (differences**2).sum(axis=-1) / sigma**2
            - free * pt.log(sigma)
            + 0.5 * log_pdet
            - 0.5 * free * _LOG_2PI
        )
        return check_parameters(logp, sigma > 0, msg="sigma > 0")

    def dist(sigma, size):
        steps = pt.as_tensor_variable(sigma) * pm.Normal.dist(0.0, 1.0, shape=(free,))
        walk = pt.cumsum(steps)
        if order == 2:
            walk = pt.cumsum(walk)
        walk = pt.concatenate([pt.zeros((order,)), walk])
        if constraint == "sum_to_zero":
            # the anchored walk projected on {A x = 0}: covariance P G P = σ² (DᵀD)⁺ (G the
            # inverse of the anchored precision, embedded with zeros at the anchors)
            a = _rw_null_space(n, order)
            walk = walk - (walk @ a.T) @ np.linalg.solve(a @ a.T, a)
        return walk

    return _vector_custom_dist("RW", dist, logp, lambda rv, size, sigma: pt.zeros((n,)))


def _vector_custom_dist(class_name, dist, logp, support_point, ndims_params=(0,)) -> dict:
    """``pm.CustomDist`` keyword arguments of a distribution over one vector (ndim_supp 1)."""
    return {
        "dist": dist,
        "logp": logp,
        "support_point": support_point,
        "ndim_supp": 1,
        "ndims_params": list(ndims_params),
        "class_name": class_name,
    }


class ComponentZeroSumTransform(Transform):
    """ℝ^{N−c} ↔ {x : x sums to zero on each component}, for sampling a constrained ICAR.

    forward: x ↦ (x_i − x_{r(i)}) for the non-root nodes i (r(i) the root of i's component);
    backward: y ↦ Π [0 at roots; y elsewhere], Π the per-component centring. They are inverse
    on the constrained subspace. backward is linear, y ↦ Π E y; its volume factor on the
    subspace is √det(Eᵀ Π E) = Π_k n_k^{−1/2}, so log_jac_det = −½ Σ_k log n_k (a constant).
    """

    name = "component_zerosum"

    def __init__(self, component: np.ndarray, roots: np.ndarray):
        self.component = np.asarray(component, dtype=np.int64)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.sizes = np.bincount(self.component)
        is_root = np.zeros(self.component.size, dtype=bool)
        is_root[self.roots] = True
        self.free = np.flatnonzero(~is_root)

    def forward(self, value, *inputs):
        value = pt.as_tensor_variable(value)
        return value[..., self.free] - value[..., self.roots[self.component[self.free]]]

    def backward(self, value, *inputs):
        x = _insert_zeros(pt.as_tensor_variable(value), self.free, self.component.size)
        return x - _component_means(x, self.component, self.sizes)

    def log_jac_det(self, value, *inputs):
        value = pt.as_tensor_variable(value)
        return pt.zeros_like(value[..., 0]) - 0.5 * float(np.log(self.sizes).sum())

    @property
    def constraint_matrix(self) -> np.ndarray:
        """A, shape (c, N): the constraint A x = 0 (row k: the indicator of component k), which
        :func:`pymc_optim.marginalize_laplace` imposes by conditioning by kriging."""
        return (self.component[None, :] == np.arange(self.sizes.size)[:, None]).astype(float)


class NullSpaceTransform(Transform):
    """ℝ^{N−k} ↔ {x : A x = 0} for a full-rank (k, N) constraint matrix A, for sampling an
    intrinsic field under linear constraints (e.g. an RW2 orthogonal to its null space).

    backward: y ↦ P E y, E inserting zeros at the k `roots` (A[:, roots] invertible) and
    P = I − Aᵀ(AAᵀ)⁻¹A the orthogonal projection on the constrained subspace. forward, its
    inverse on the subspace: x ↦ x_F − x_R A_R⁻ᵀ A_F (x_R, x_F the roots' and the others'
    values). The volume factor of backward on the subspace is √det(EᵀPE) = |det A_R| /
    √det(AAᵀ), a constant. :func:`pymc_optim.marginalize_laplace` reads `constraint_matrix`
    and integrates over the subspace by kriging in the N original coordinates instead.

    Parameters
    ----------
    constraint_matrix : array_like, shape (k, N)
    roots : array_like of int, shape (k,)
    """

    name = "null_space"

    def __init__(self, constraint_matrix, roots):
        a = np.atleast_2d(np.asarray(constraint_matrix, dtype=np.float64))
        self.constraint_matrix = a
        self.roots = np.asarray(roots, dtype=np.int64)
        k, n = a.shape
        keep = np.ones(n, dtype=bool)
        keep[self.roots] = False
        self.free = np.flatnonzero(keep)
        a_r = a[:, self.roots]
        self._projector = np.linalg.solve(a @ a.T, a)  # (AAᵀ)⁻¹A
        self._forward = np.linalg.solve(a_r, a[:, self.free])  # A_R⁻¹ A_F
        self._log_jac = float(np.log(abs(np.linalg.det(a_r))) - 0.5 * np.linalg.slogdet(a @ a.T)[1])

    def forward(self, value, *inputs):
        value = pt.as_tensor_variable(value)
        return value[..., self.free] - value[..., self.roots] @ self._forward

    def backward(self, value, *inputs):
        x = _insert_zeros(pt.as_tensor_variable(value), self.free, self.constraint_matrix.shape[1])
        return x - (x @ self.constraint_matrix.T) @ self._projector

    def log_jac_det(self, value, *inputs):
        return pt.zeros_like(pt.as_tensor_variable(value)[..., 0]) + self._log_jac


class _CornerTransform(Transform):
    """ℝ^{N−c} ↔ {x : x = 0 at the roots}: drop / re-insert the roots (an isometry)."""

    name = "component_corner"

    def __init__(self, n: int, free: np.ndarray):
        self.n = int(n)
        self.free = np.asarray(free, dtype=np.int64)

    def forward(self, value, *inputs):
        return pt.as_tensor_variable(value)[..., self.free]

    def backward(self, value, *inputs):
        return _insert_zeros(pt.as_tensor_variable(value), self.free, self.n)

    def log_jac_det(self, value, *inputs):
        return pt.zeros_like(pt.as_tensor_variable(value)[..., 0])


# --- graph validation and the constants of the densities -------------------------------------


class _Graph:
    """Validated undirected graph: edges (i < j), weights, components and log det* L."""

    def __init__(self, n, i, j, w, constraint, epsilon):
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        self.n, self.i, self.j, self.w = n, i, j, w
        self.constraint, self.epsilon = constraint, float(epsilon)
        adjacency = coo_matrix((np.ones(i.size), (i, j)), shape=(n, n))
        self.n_components, self.component = connected_components(adjacency, directed=False)
        self.sizes = np.bincount(self.component)
        first = np.full(self.n_components, n)
        np.minimum.at(first, self.component, np.arange(n))
        self.roots = first
        self.grounded, self.grounded_values, self.free = _grounded_laplacian(n, i, j, w, self.roots)
        lx, failed = _cholesky.factorize(self.grounded._analysis(), self.grounded_values)
        if failed >= 0:  # pragma: no cover - a connected graph's grounded Laplacian is SPD
            raise RuntimeError("the grounded graph Laplacian is not positive definite")
        self.grounded_factor = lx
        self.log_pdet = float(
            np.log(self.sizes).sum() + _cholesky.logdet(self.grounded._analysis(), lx)
        )


def _one_field(class_name: str, n: int, kwargs: dict) -> dict:
    """Refuse `size`, `shape` or `dims` asking for several fields at once: the draws and the
    log density are those of one vector of `n` values (a batch was silently ignored)."""
    size, shape, dims = kwargs.get("size"), kwargs.get("shape"), kwargs.get("dims")
    batched = (
        (size is not None and tuple(np.atleast_1d(size)) not in ((), (n,)))
        or (shape is not None and tuple(np.atleast_1d(shape)) != (n,))
        or (dims is not None and not isinstance(dims, str) and len(dims) > 1)
    )
    observed = kwargs.get("observed")
    if observed is not None:
        _check_length(class_name, observed, n)
    if batched:
        asked = {k: kwargs[k] for k in ("size", "shape", "dims") if kwargs.get(k) is not None}
        raise ValueError(
            f"`{class_name}` is one field of {n} values; got {asked}, which asks for several. "
            f"Drop `size`/`shape` (or pass `shape={n}`, one dim), and write one variable per "
            "field."
        )
    return kwargs


def _scalar(class_name: str, argument: str, value):
    """A scale parameter as a float tensor, refused unless it is a scalar: the draws read an
    array element by element while the density summed one full-field density per element, so
    the model's density was not that of its draws."""
    value = floatX(value)
    shape = pt.as_tensor_variable(value).type.shape
    if shape:
        raise ValueError(
            f"`{class_name}`'s `{argument}` must be a scalar (one scale for the whole field); got "
            f"a {len(shape)}-d value of shape {shape}. Scale the field "
            f"afterwards for a scale per node, or write one `{class_name}` per scale."
        )
    return value


def _check_length(class_name: str, value, n: int) -> None:
    """A value whose length is known and is not the field's: a ValueError (the density read
    n of its entries, or normalised for n, and gave a number)."""
    length = pt.as_tensor_variable(value).type.shape[-1:]
    if length and length[0] is not None and length[0] != n:
        raise ValueError(
            f"`{class_name}`'s value must have {n} entries (one per node of the field); got "
            f"{length[0]}. Check the observed data or the value passed to pm.logp."
        )


def _icar_arguments(
    edges=None,
    *,
    adjacency=None,
    weights=None,
    n: int | None = None,
    sigma=1.0,
    constraint: Literal["sum_to_zero", "soft", "corner"] = "sum_to_zero",
    epsilon: float = 1e-3,
    islands: Literal["error", "per_component"] = "error",
    **kwargs,
):
    """``ICAR``'s arguments (one signature for the named and the unnamed form): the checked
    graph, σ, and the keyword arguments left for ``pm.CustomDist``."""
    graph = _icar_graph(edges, adjacency, weights, n, constraint, epsilon, islands)
    return graph, _scalar("ICAR", "sigma", sigma), _one_field("ICAR", graph.n, kwargs)


def _icar_graph(edges, adjacency, weights, n, constraint, epsilon, islands) -> _Graph:
    if constraint not in ("sum_to_zero", "soft", "corner"):
        raise ValueError(
            f'`constraint` must be "sum_to_zero", "soft" or "corner"; got {constraint!r}. An '
            "ICAR without a constraint is improper (flat along each component's mean)."
        )
    if islands not in ("error", "per_component"):
        raise ValueError(f'`islands` must be "error" or "per_component"; got {islands!r}.')
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"`epsilon` must be a positive number; got {epsilon!r}.")
    if (edges is None) == (adjacency is None):
        raise ValueError("Give exactly one of `edges` (an (E, 2) index array) or `adjacency`.")
    if adjacency is not None:
        if weights is not None or n is not None:
            raise ValueError(
                "`weights` and `n` go with `edges`; `adjacency` carries both. Drop them."
            )
        n, i, j, w = _edges_from_adjacency(adjacency)
    else:
        n, i, j, w = _check_edges(edges, weights, n)
    degree = np.bincount(i, minlength=n) + np.bincount(j, minlength=n)
    isolated = np.flatnonzero(degree == 0)
    if isolated.size:
        raise ValueError(
            f"The graph has {isolated.size} isolated node(s) (no neighbour), e.g. node "
            f"{isolated[0]}: an ICAR value there has no distribution (the density does not "
            "depend on it). Remove those nodes from the field or give them their own prior "
            "(e.g. an iid effect)."
        )
    graph = _Graph(n, i, j, w, constraint, epsilon)
    if graph.n_components > 1 and islands == "error":
        raise ValueError(
            f"The graph has {graph.n_components} connected components (islands), of sizes "
            f'{_preview(np.sort(graph.sizes)[::-1])}. Pass `islands="per_component"` for one '
            "sum-to-zero constraint per component (INLA's convention), or connect the islands "
            "in the adjacency."
        )
    return graph


def _check_edges(edges, weights, n):
    edges = np.asarray(edges)
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise ValueError(
            "`edges` must be an integer array of shape (E, 2), one row (i, j) per undirected "
            f"edge; got dtype {edges.dtype} with shape {edges.shape}."
        )
    if edges.size == 0:
        raise ValueError("`edges` is empty: an ICAR needs a graph with at least one edge.")
    n = int(edges.max()) + 1 if n is None else int(n)
    if edges.min() < 0 or edges.max() >= n:
        raise ValueError(
            f"`edges` must index nodes 0..{n - 1} (n = {n}); got indices in "
            f"[{edges.min()}, {edges.max()}]."
        )
    loops = np.flatnonzero(edges[:, 0] == edges[:, 1])
    if loops.size:
        raise ValueError(
            f"`edges` must not contain self-loops; got ({edges[loops[0], 0]}, "
            f"{edges[loops[0], 1]}) at row {loops[0]}."
        )
    i, j = np.minimum(edges[:, 0], edges[:, 1]), np.maximum(edges[:, 0], edges[:, 1])
    key = i.astype(np.int64) * n + j
    unique, first, counts = np.unique(key, return_index=True, return_counts=True)
    if (counts > 1).any():
        k = np.flatnonzero(counts > 1)[0]
        a, b = divmod(int(unique[k]), n)
        raise ValueError(
            f"`edges` must list each undirected edge once; ({a}, {b}) appears {counts[k]} times "
            "(counting (j, i) as (i, j)). Drop the repeats (sum their weights if intended)."
        )
    w = np.ones(i.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (i.size,) or not (np.isfinite(w).all() and (w > 0).all()):
        raise ValueError(
            f"`weights` must be {i.size} positive finite numbers, one per edge; got shape "
            f"{w.shape}" + ("" if w.shape != (i.size,) else f", min {w.min():.3g}") + "."
        )
    return n, i.astype(np.int64), j.astype(np.int64), w


def _edges_from_adjacency(adjacency):
    import scipy.sparse as sp

    matrix = sp.coo_array(adjacency, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"`adjacency` must be square; got shape {matrix.shape}.")
    n = matrix.shape[0]
    csr = sp.csr_array(matrix)
    csr.eliminate_zeros()
    if (csr.data < 0).any() or not np.isfinite(csr.data).all():  # before symmetry: NaN ≠ NaN
        coo = csr.tocoo()
        k = int(np.flatnonzero(~(np.isfinite(coo.data) & (coo.data >= 0)))[0])
        raise ValueError(
            "`adjacency` must hold non-negative finite weights; got "
            f"W[{coo.row[k]}, {coo.col[k]}] = {coo.data[k]:.6g}."
        )
    asymmetric = abs(csr - csr.T)
    asymmetric.eliminate_zeros()
    if asymmetric.nnz:
        a = asymmetric.tocoo()
        k = int(np.argmax(a.data))
        r, c = int(a.row[k]), int(a.col[k])
        raise ValueError(
            "`adjacency` must be symmetric (an undirected graph); "
            f"W[{r}, {c}] = {csr[r, c]:.6g} but W[{c}, {r}] = {csr[c, r]:.6g}. Symmetrize it, "
            "e.g. `W.maximum(W.T)` for a 0/1 adjacency."
        )
    coo = csr.tocoo()
    if (coo.row == coo.col).any():
        r = int(coo.row[coo.row == coo.col][0])
        raise ValueError(
            f"`adjacency` must have a zero diagonal (no self-loops); got W[{r}, {r}] = "
            f"{csr[r, r]:.6g}."
        )
    upper = coo.row < coo.col
    return n, coo.row[upper].astype(np.int64), coo.col[upper].astype(np.int64), coo.data[upper]


def _icar_marginal_variances(graph: _Graph) -> np.ndarray:
    """diag(L⁺), the variances of a unit-scale ICAR under its per-component sum-to-zero
    constraint: G_ii − 2 (G1)_i / n_k + 1ᵀG1 / n_k² with G the grounded Laplacian's inverse
    (zero at the roots); see :func:`bym2_scaling_factor`'s Notes."""
    symbolic = graph.grounded._analysis()
    selected = _cholesky.selected_inverse(symbolic, graph.grounded_factor)
    on_diagonal = graph.grounded.rows == graph.grounded.cols
    g = np.zeros(graph.n)  # diag(G), zero at the roots
    g[graph.free[graph.grounded.rows[on_diagonal]]] = selected[on_diagonal]
    u = np.zeros(graph.n)  # G 1: G is block-diagonal by component, so this is G_k 1_k
    u[graph.free] = _cholesky.solve(symbolic, graph.grounded_factor, np.ones(graph.free.size))
    sizes = graph.sizes[graph.component]
    total = np.bincount(graph.component, weights=u, minlength=graph.n_components)
    return g - 2.0 * u / sizes + total[graph.component] / sizes**2


def _grounded_laplacian(n, i, j, w, roots):
    """The Laplacian without the roots' rows and columns, as a SparsePattern and values."""
    keep = np.ones(n, dtype=bool)
    keep[roots] = False
    free = np.flatnonzero(keep)
    new = np.full(n, -1, dtype=np.int64)
    new[free] = np.arange(free.size)
    degree = np.bincount(i, weights=w, minlength=n) + np.bincount(j, weights=w, minlength=n)
    both = keep[i] & keep[j]
    a, b = new[i[both]], new[j[both]]
    rows = np.concatenate([np.arange(free.size), np.maximum(a, b)])
    cols = np.concatenate([np.arange(free.size), np.minimum(a, b)])
    values = np.concatenate([degree[free], -w[both]])
    return SparsePattern(rows, cols, free.size), values, free


def _component_sums(x, component, sizes):
    """Per-component sums of x over its last axis, by gathers and a cumulative sum only (no
    set/inc_subtensor: those do not vectorize over the batched Jacobians of the Laplace)."""
    order = np.argsort(component, kind="stable")
    ends = np.cumsum(sizes) - 1
    running = pt.cumsum(x[..., order], axis=-1)[..., ends]
    previous = pt.concatenate([pt.zeros_like(running[..., :1]), running[..., :-1]], axis=-1)
    return running - previous


def _component_means(x, component, sizes):
    """Per-component mean of x (last axis), broadcast back to every node."""
    return (_component_sums(x, component, sizes) / sizes)[..., component]


def _insert_zeros(value, free, n):
    """x with x[free] = value and zeros elsewhere (last axis), as one gather."""
    position = np.zeros(n, dtype=np.int64)  # index into [0, value...]
    position[free] = np.arange(1, free.size + 1)
    padded = pt.concatenate([pt.zeros_like(value[..., :1]), value], axis=-1)
    return padded[..., position]


def _preview(values, k=5) -> str:
    shown = ", ".join(str(v) for v in values[:k])
    return f"[{shown}{', ...' if len(values) > k else ''}]"


# --- the CustomDist pieces --------------------------------------------------------------------


def _laplacian_quadratic(graph: _Graph, x):
    """xᵀ L x = Σ_edges w_ij (x_i − x_j)², O(E), no matrix."""
    return (graph.w * (x[..., graph.i] - x[..., graph.j]) ** 2).sum(axis=-1)


def _icar_custom_dist_kwargs(graph: _Graph) -> dict:
    n, c = graph.n, graph.n_components
    soft = graph.constraint == "soft"
    corner = graph.constraint == "corner"
    eps = graph.epsilon
    # log det of the constrained precision's non-zero part: L⁺'s on the zero-sum subspace,
    # the grounded Laplacian's for the corner constraint.
    log_det = graph.log_pdet - float(np.log(graph.sizes).sum()) if corner else graph.log_pdet

    def logp(value, sigma):
        _check_length("ICAR", value, n)
        quadratic = _laplacian_quadratic(graph, value) / sigma**2
        # Normalised on the (N − c)-dim constrained subspace: ½ log det*(L/σ²) − (N − c)/2 log 2π.
        normaliser = 0.5 * log_det - (n - c) * pt.log(sigma) - 0.5 * (n - c) * _LOG_2PI
        logp = -0.5 * quadratic + normaliser
        if soft:
            sums = _component_sums(value, graph.component, graph.sizes)
            penalty = (sums**2 / (eps**2 * graph.sizes**2)).sum(axis=-1)
            # The c null directions get precision 1/(ε² n_k): log det adds −Σ log(ε² n_k).
            normaliser_soft = -0.5 * float(np.log(eps**2 * graph.sizes).sum()) - 0.5 * c * _LOG_2PI
            logp = logp - 0.5 * penalty + normaliser_soft
        return check_parameters(logp, sigma > 0, msg="sigma > 0")

    def dist(sigma, size):
        z = pm.Normal.dist(0.0, 1.0, shape=(graph.free.size,))
        grounded = SparseFactorSolveOp(graph.grounded, transposed=True)(graph.grounded_values, z)
        x = pt.zeros((n,))[graph.free].set(grounded)
        if not corner:
            x = x - _component_means(x, graph.component, graph.sizes)
        x = pt.as_tensor_variable(sigma) * x
        if soft:
            # The null directions, whatever σ: each component's mean ~ N(0, ε²) (precision
            # 1/(ε² n_k) on the unit vector a_k/√n_k, as `logp` has it)
            x = x + pm.Normal.dist(0.0, eps, shape=(c,))[graph.component]
        return x

    return _vector_custom_dist("ICAR", dist, logp, lambda rv, size, sigma: pt.zeros((n,)))


def _gmrf_custom_dist_kwargs(precision) -> dict:
    import scipy.sparse as sp

    if not sp.issparse(precision):
        raise TypeError(
            f"`precision` must be a scipy.sparse matrix; got {type(precision).__name__}. Use "
            "`scipy.sparse.csr_array(Q)` (or pm.MvNormal for a small dense precision)."
        )
    try:
        pattern, values = SparsePattern.from_scipy(precision)
    except ValueError as error:
        raise ValueError(str(error).replace("`matrix`", "`precision`")) from None
    lx, failed = _cholesky.factorize(pattern._analysis(), values)
    if failed >= 0:
        raise ValueError(
            "`precision` must be positive definite; its Cholesky factorization fails at pivot "
            f"{failed} (of {pattern.n}). For an intrinsic precision (a graph Laplacian) use "
            "`ICAR`; otherwise add to the diagonal."
        )
    n = pattern.n
    log_det = _cholesky.logdet(pattern._analysis(), lx)
    off = pattern.rows != pattern.cols
    weights = np.where(off, 2.0, 1.0) * values  # xᵀQx = Σ_e (2 − δ) v_e x_r x_c

    def logp(value, mu, tau):
        _check_length("GMRF", value, n)
        d = value - mu
        quadratic = (weights * d[..., pattern.rows] * d[..., pattern.cols]).sum(axis=-1)
        logp = -0.5 * tau * quadratic + 0.5 * n * pt.log(tau) + 0.5 * log_det - 0.5 * n * _LOG_2PI
        return check_parameters(logp, tau > 0, msg="tau > 0")

    def dist(mu, tau, size):
        z = pm.Normal.dist(0.0, 1.0, shape=(n,))
        draw = SparseFactorSolveOp(pattern, transposed=True)(values, z)
        return pt.broadcast_to(mu, (n,)) + draw / pt.sqrt(tau)

    def support_point(rv, size, mu, tau):
        return pt.broadcast_to(mu, (n,)).astype(rv.dtype)

    return _vector_custom_dist("GMRF", dist, logp, support_point, ndims_params=[1, 0])
