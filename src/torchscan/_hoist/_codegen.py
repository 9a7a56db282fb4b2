"""The code generated for a hoisted step: the Python source of its programs and of the loop that
runs the carry's part at every step."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from torchscan import _compat


def _callable(target: Any, fast: bool) -> Any:
    """What a generated function calls for ``target``: with ``fast``, the function of the
    ``torch`` namespace that the operator's overload packet names where there is one (it
    resolves the same overload from the same arguments, and is called at less cost than the
    overload), else the operator."""
    if fast and isinstance(target, _compat.OpOverload):
        function = _compat.torch_function_of(target)
        if function is not None:
            return function
    return target


class _Source:
    """The source of a generated function, and the objects it reads as globals."""

    def __init__(self, names: dict[torch.fx.Node, str], fresh: dict[torch.fx.Node, torch.Tensor]):
        self.names = names
        self.fresh = fresh
        self.globals: dict[str, Any] = {"operator": operator}
        self.lines: list[str] = []
        self._ids: dict[int, str] = {}

    def value(self, obj: Any) -> str:
        if isinstance(obj, torch.fx.Node):
            if obj in self.names:
                return self.names[obj]
            return self.constant(self.fresh[obj])
        if isinstance(obj, (list, tuple)):
            items = ", ".join(self.value(item) for item in obj)
            return (
                f"[{items}]"
                if isinstance(obj, list)
                else f"({items}{',' if len(obj) == 1 else ''})"
            )
        if isinstance(obj, (bool, int, str)) or obj is None:
            return repr(obj)
        return self.constant(obj)

    def constant(self, obj: Any) -> str:
        name = self._ids.get(id(obj))
        if name is None:
            name = self._ids[id(obj)] = f"g_{len(self.globals)}"
            self.globals[name] = obj
        return name

    def operation(self, node: torch.fx.Node, fast: bool, indent: str) -> None:
        if node in self.names:  # an argument of the function
            return
        name = self.names[node] = f"v_{len(self.names)}"
        if node.op == "get_attr":
            self.lines.append(f"{indent}{name} = {self.constant(self.fresh[node])}")
            return
        if node.target is operator.getitem:
            base, index = node.args
            self.lines.append(f"{indent}{name} = {self.value(base)}[{int(index)}]")  # type: ignore[call-overload]
            return
        function = self.constant(_callable(node.target, fast))
        arguments = [self.value(a) for a in node.args]
        arguments += [f"{k}={self.value(v)}" for k, v in node.kwargs.items()]
        self.lines.append(f"{indent}{name} = {function}({', '.join(arguments)})")

    def compile(self, name: str) -> Callable[..., Any]:
        text = "\n".join(self.lines) + "\n"
        namespace = dict(self.globals)
        exec(compile(text, f"<torchscan hoisted {name}>", "exec"), namespace)
        return namespace[name]


def _generate(
    name: str,
    parameters: Sequence[str],
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    names: dict[torch.fx.Node, str],
    fresh: dict[torch.fx.Node, torch.Tensor],
    *,
    fast: bool,
) -> Callable[..., list[Any]]:
    source = _Source(names, fresh)
    source.lines.append(f"def {name}({', '.join(parameters)}):")
    for node in nodes:
        source.operation(node, fast, "    ")
    source.lines.append(f"    return [{', '.join(source.value(n) for n in outputs)}]")
    return source.compile(name)


def _generate_loop(
    carry: Sequence[torch.fx.Node],
    columns: Sequence[torch.fx.Node],
    n_fixed: int,
    nodes: Sequence[torch.fx.Node],
    carry_out: Sequence[Any],
    y_out: Sequence[Any],
    fixed_names: dict[torch.fx.Node, str],
    stop: Any,
) -> tuple[Callable[..., Any], str]:
    """``loop(carry, columns, fixed, order)``: the Python loop of the carry's class; with
    ``stop`` (what ``until`` returns), the step that returns a true one is the last."""
    names = dict(fixed_names)
    for i, node in enumerate(carry):
        names[node] = f"c_{i}"
    for i, node in enumerate(columns):
        names[node] = f"s_{i}"
    source = _Source(names, {})
    lines = source.lines
    lines.append("def loop(carry, columns, fixed, order):")
    for count, prefix, group in (
        (len(carry), "c", "carry"),
        (len(columns), "column", "columns"),
        (n_fixed, "k", "fixed"),
    ):
        if count:
            lines.append(f"    {', '.join(f'{prefix}_{i}' for i in range(count))}, = {group}")
    for i in range(len(y_out)):
        lines.append(f"    ys_{i} = []")
    lines.append("    ran = 0")
    lines.append("    for t in order:")
    lines.append("        ran += 1")
    read = {a for n in nodes for a in n.all_input_nodes} | {
        v for v in (*carry_out, *y_out, stop) if isinstance(v, torch.fx.Node)
    }
    for i, node in enumerate(columns):
        if node in read:  # (a column nothing reads, a step number the body ignores: not taken)
            lines.append(f"        s_{i} = column_{i}[t]")
    for node in nodes:
        source.operation(node, True, "        ")
    for i, node in enumerate(y_out):  # before the carry changes: y may be the old carry
        lines.append(f"        ys_{i}.append({source.value(node)})")
    if stop is not None:
        lines.append(f"        stop = {source.value(stop)}")
    if carry:
        new = ", ".join(source.value(n) for n in carry_out)
        lines.append(f"        {', '.join(f'c_{i}' for i in range(len(carry)))}, = {new},")
    if stop is not None:
        lines.append("        if stop:")
        lines.append("            break")
    if not nodes and not carry and not y_out:
        lines.append("        pass")
    carry_list = ", ".join(f"c_{i}" for i in range(len(carry)))
    ys_list = ", ".join(f"ys_{i}" for i in range(len(y_out)))
    lines.append(f"    return [{carry_list}], [{ys_list}], ran")
    return source.compile("loop"), "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The cache and the runner
