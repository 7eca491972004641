"""Every aten op of a step, traced (`Trace`, a TorchDispatchMode): its name, the phase
(forward, backward, optimizer), the module and parameters it works on, the source line that
called it, and a SHA-256 of each output's bytes (`tensor_hash`, order-sensitive). explain
(probes/explain.py) compares the traces of two runs' replays to name the first op whose
outputs differ, and runs that op again on its recorded inputs to say why.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

TORCH_DIR = os.path.dirname(torch.__file__)
# The tracer's own frames and explain's replays, never an op's call site.
HERE = tuple(os.path.join(os.path.dirname(__file__), name)
             for name in ("trace.py", "explain.py"))

# Ops whose output is memory not yet written: its bytes mean nothing.
UNINITIALISED = {"aten.empty.memory_format", "aten.empty_like.default",
                 "aten.new_empty.default", "aten.empty_strided.default",
                 "aten.new_empty_strided.default"}


def tensor_hash(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes in its logical (contiguous) order, with dtype and shape:
    bitwise and order-sensitive."""
    t = t.detach()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.layout == torch.strided and t.numel():
        flat = t.to("cpu").contiguous().reshape(-1)
        flat = flat.to(torch.uint8) if flat.dtype == torch.bool else flat.view(torch.uint8)
        h.update(flat.numpy().tobytes())
    return h.hexdigest()[:24]


def tensors_in(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


@dataclass
class Op:
    index: int
    name: str
    phase: str                      # forward, backward or optimizer
    module: str                     # where in the model ("" where none says)
    params: list[str]               # parameters (or their gradients) it reads or writes
    source: str                     # the line that called it
    inputs: list[str]
    strides: list[list[int]]         # the inputs' memory layouts (they can choose the kernel)
    outputs: list[str]
    dtypes: list[str]
    device: str
    args: Any = None                # its inputs, kept to run it again
    out: list[torch.Tensor] = field(default_factory=list)
    func: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("args", "out", "func")}


def _caller(skip: tuple[str, ...]) -> str:
    """The innermost frame outside torch and `skip` (the tracer's and explain's): where the
    model or the loop called the op."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(TORCH_DIR) and name not in skip:
            return f"{_short(name)}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return ""


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("tui_trainer"):]) if "tui_trainer" in parts else path


def _from_traceback(frames: list[str] | None) -> str:
    """The forward's calling line of a backward node (autograd's anomaly mode keeps the
    stack of the op that made the node)."""
    for frame in reversed(frames or []):
        head = frame.strip().splitlines()[0] if frame.strip() else ""
        if head.startswith('File "') and TORCH_DIR not in head and \
                not any(h in head for h in HERE):
            path, _, rest = head[6:].partition('", line ')
            line, _, func = rest.partition(", in ")
            return f"{_short(path)}:{line} ({func})"
    return ""


class Trace(TorchDispatchMode):
    """Every aten op of one training step, in order, with the hashes of its inputs and
    outputs; views and not-yet-written memory are left out (they carry no new bits)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self.names = {m: n for n, m in model.named_modules()}
        self.root = type(model).__name__
        self.param_of = {p.data_ptr(): n for n, p in model.named_parameters()}
        self.model = model
        self.stack: list[str] = []
        self.after_backward = False
        self._hooks: list[Any] = []

    def __enter__(self) -> "Trace":
        def enter(m: torch.nn.Module, _args: Any) -> None:
            self.stack.append(self._path(m))

        def leave(m: torch.nn.Module, _args: Any, _out: Any) -> None:
            if self.stack:                  # (a hook that returns something replaces the
                self.stack.pop()            # module's output)
        self._hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
                       torch.nn.modules.module.register_module_forward_hook(leave)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for h in self._hooks:
            h.remove()
        super().__exit__(*exc)

    def _path(self, m: torch.nn.Module) -> str:
        name = self.names.get(m)
        return self.root if not name else f"{self.root}.{name}"

    def _params(self, tensors: list[torch.Tensor]) -> list[str]:
        grads = {p.grad.data_ptr(): n for n, p in self.model.named_parameters()
                 if p.grad is not None}
        out = []
        for t in tensors:
            try:
                ptr = t.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                continue
            name = self.param_of.get(ptr) or (grads[ptr] + " (grad)" if ptr in grads else None)
            if name and name not in out:
                out.append(name)
        return out

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = str(func)
        skip = func.is_view or name in UNINITIALISED
        ins = tensors_in((args, kwargs)) if not skip else []
        in_hashes = [tensor_hash(t) for t in ins]
        kept = tree_map(lambda a: a.detach().clone() if isinstance(a, torch.Tensor) else a,
                        (args, kwargs)) if not skip else None
        out = func(*args, **kwargs)
        if skip:
            return out
        outs = tensors_in(out)
        node = torch._C._current_autograd_node() \
            if torch._C._current_graph_task_id() != -1 else None
        if node is not None:
            phase, self.after_backward = "backward", True
            module, source = _node_module(node, self.root), \
                _from_traceback(node.metadata.get("traceback_"))
        else:
            phase = "optimizer" if self.after_backward else "forward"
            module = self.stack[-1] if self.stack else ""
            source = _caller(HERE)
        params = self._params(ins + outs)
        self.ops.append(Op(
            index=len(self.ops), name=name, phase=phase, module=module, params=params,
            source=source, inputs=in_hashes, strides=[list(t.stride()) for t in ins],
            outputs=[tensor_hash(t) for t in outs],
            dtypes=[str(t.dtype).replace("torch.", "") for t in outs],
            device=str(outs[0].device) if outs else "", args=kept,
            out=[t.detach().clone() for t in outs], func=func))
        return out


def _node_module(node: Any, root: str) -> str:
    """The module of a backward node: the one whose parameters it feeds (through at most
    two nodes: AddmmBackward0 -> TBackward0 -> AccumulateGrad of fc2.weight)."""
    names: list[str] = []

    def walk(n: Any, depth: int) -> None:
        if n is None or depth > 2:
            return
        var = getattr(n, "variable", None)
        if var is not None and getattr(var, "_explain_name", None):
            names.append(var._explain_name)
        for nxt, _ in n.next_functions:
            walk(nxt, depth + 1)
    walk(node, 0)
    modules = sorted({n.rsplit(".", 1)[0] for n in names})
    return f"{root}.{modules[0]}" if len(modules) == 1 else ""
