"""Call a separately compiled numba function through its address instead of linking its code.

Numba finalizes a function's library by linking in the libraries of every function it calls and
optimizing and compiling the whole module again. A solver called from a log density is linked
into PyTensor's cache wrapper around it, into the function graph and into the graph's cache
wrapper: its code, most of the module, was optimized and compiled once per level. Called through
its address it is compiled once per process (or loaded from numba's disk cache), and every graph
that calls it, in any function compiled later, reuses it.

``register_outlined(op_type)`` registers an Op's numba implementation, a dispatch function
returning ``(function, key)`` as for PyTensor's ``register_funcify_and_cache_key``, so that
PyTensor gets ``outlined(function, key)``.
``outlined(function, key)`` is the numba function to hand to PyTensor in place of `function`
(an njit function whose code `key` determines): it calls `function` through its address, and
`function` is compiled once per process and key and kept on numba's disk cache under `key`.
Underneath, ``outline(key, dispatcher)`` registers a dispatcher and ``call_outlined(key, (a, b,
...))``, inside a numba function, calls it with numba's own calling convention (exceptions and
references as in a linked call). The address is looked up once per call site and process, on
the first call, from the key and the argument types, so a function graph loaded from numba's
disk cache finds the dispatcher registered again when PyTensor funcifies the graph's nodes.
"""

from __future__ import annotations

import functools
import pickle
import uuid

import numba
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.caching import FunctionCache
from numba.extending import intrinsic
from pytensor import config
from pytensor.link.numba.cache import CACHED_SRC_FUNCTIONS, compile_numba_function_src
from pytensor.link.numba.dispatch.basic import numba_njit, register_funcify_and_cache_key

__all__ = ["call_outlined", "outline", "outlined", "register_outlined"]

_FUNCTIONS: dict[str, numba.core.registry.CPUDispatcher] = {}


def register_outlined(op_type):
    """PyTensor's ``register_funcify_and_cache_key(op_type)`` for a dispatch function returning
    ``(function, key)``, PyTensor getting `function` outlined under `key` (:func:`outlined`)."""

    def decorator(dispatch):
        @functools.wraps(dispatch)
        def outlined_dispatch(op, node=None, **kwargs):
            function, key = dispatch(op, node=node, **kwargs)
            return outlined(function, key), key

        register_funcify_and_cache_key(op_type)(outlined_dispatch)
        return dispatch

    return decorator


def outlined(function, key: str | None):
    """A numba function calling the njit function `function` through its address.

    `function` is compiled once per process and `key` (a key that determines its code), and
    kept on numba's disk cache (PyTensor's numba cache directory, unless its ``numba__cache``
    flag is off) under `key`; without a key, once per call of this function and never on disk.
    """
    if key is not None and config.numba__cache:
        options = {k: v for k, v in function.targetoptions.items() if k != "nopython"}
        function = numba.njit(**options)(function.py_func)  # a dispatcher of its own
        CACHED_SRC_FUNCTIONS[function.py_func] = key
        function._cache = _KeyedFunctionCache(function.py_func, key)
    key = key if key is not None else uuid.uuid4().hex
    outline(key, function)
    src = f"def {function.__name__}(*args):\n    return call_outlined({key!r}, args)\n"
    env = {"call_outlined": call_outlined}
    return numba_njit(compile_numba_function_src(src, function.__name__, env))


class _KeyedFunctionCache(FunctionCache):
    """numba's disk cache of a function, indexed by a key that determines its code.

    numba indexes a closure by the pickled bytes of its cells, here compiled functions whose
    pickles differ between processes: the cache would never be hit.
    """

    def __init__(self, py_func, key: str):
        self._key = key
        super().__init__(py_func)

    def _index_key(self, sig, codegen):
        return (sig, codegen.magic_tuple(), self._key)


def outline(key: str, dispatcher):
    """Register `dispatcher` under `key`; the dispatcher registered first under a key is kept
    (the key determines the code), and returned."""
    return _FUNCTIONS.setdefault(key, dispatcher)


def _compiled(key: str, argtypes: tuple):
    try:
        dispatcher = _FUNCTIONS[key]
    except KeyError:
        raise RuntimeError(
            f"no numba function is registered under {key[:16]}...: the graph calling it was "
            "loaded without funcifying the node that registers it"
        ) from None
    dispatcher.compile(argtypes)
    return dispatcher.overloads[argtypes]


def _address(token: str) -> int:
    """The machine-code address of the function behind `token` (its key and argument types)."""
    key, signature = token.split(":", 1)
    compiled = _compiled(key, pickle.loads(bytes.fromhex(signature)))
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)


@numba_njit
def _pointer(token):
    with numba.objmode(address="intp"):
        address = _address(token)
    return address


@intrinsic(prefer_literal=True)
def call_outlined(typingctx, key, args):
    """``call_outlined(key, args)``: the function registered under the literal `key` applied to
    the tuple `args`."""
    if not isinstance(key, types.StringLiteral) or not isinstance(args, types.BaseTuple):
        return None
    argtypes = tuple(args.types)
    restype = _compiled(key.literal_value, argtypes).signature.return_type
    token = f"{key.literal_value}:{pickle.dumps(argtypes).hex()}"
    pointer_signature = typingctx.resolve_function_type(
        types.Dispatcher(_pointer), [types.unicode_type], {}
    )

    def codegen(context, builder, signature, llargs):
        pointer_type = ir.PointerType(ir.IntType(8))
        cached = cgutils.add_global_variable(builder.module, pointer_type, "pymc_optim_outlined")
        cached.linkage = "private"
        cached.initializer = pointer_type(None)
        cached.align = 64
        address = builder.load_atomic(cached, "acquire", 64)
        slot = cgutils.alloca_once_value(builder, address)
        with builder.if_then(cgutils.is_null(builder, address), likely=False):
            get = context.get_function(types.Dispatcher(_pointer), pointer_signature)
            found = get(builder, [context.get_constant_generic(builder, types.unicode_type, token)])
            found = builder.inttoptr(found, pointer_type)
            builder.store_atomic(found, cached, "release", 64)
            builder.store(found, slot)
        function_type = context.call_conv.get_function_type(restype, argtypes)
        function = builder.bitcast(builder.load(slot), function_type.as_pointer())
        values = [builder.extract_value(llargs[1], i) for i in range(len(argtypes))]
        status, result = context.call_conv.call_function(
            builder, function, restype, argtypes, values
        )
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return result

    return restype(key, args), codegen
