"""torchscan's higher-order operators: what ``scan`` becomes while a model is being exported.

Eagerly, ``scan`` is a Python loop. Under ``torch.export`` (which ``torch.onnx.export(...,
dynamo=True)`` runs) it calls the operator ``torchscan_scan`` instead, so that the exported program
holds one node with the traced body as a subgraph and the loop's static description (the axis and
direction of every sequence and output) as plain Python arguments. ``torchscan.onnx`` translates
that node into one ONNX ``Scan``.

``torchscan_scan(body, carries, xs, captured, in_axes, in_reverse, out_axes, out_reverse,
nonempty)`` returns ``(*final_carries, *ys)``. ``body(*carries, *x_slices, *captured)`` returns
``(*new_carries, *y_slices)``; every argument is a flat tuple of tensors (pytrees and ``None``
leaves are handled before and after, in ``traced_scan``). ``out_axes`` and ``out_reverse`` may
hold one entry to apply to every output, since the number of outputs is only known once the body
has been traced. ``nonempty``, set while tracing, records whether the program's shapes keep the
length at 1 or more (the ONNX translation guards a Scan that may run zero steps).
``torchscan_loop(body, trip_count, cond, carries, captured, has_until)`` is the
same for ``loop`` and for a scan that stops early, and becomes one ONNX ``Loop``.

Modules: ``_scan_op`` and ``_loop_op`` (the operators and their implementations), ``_lower``
(the operators computed by torch's own scan, for ``torchscan.lower_to_torch``), ``_body`` (tracing
a body into a subgraph and recording the call), ``_indexing`` (indexing with tensors, such as the
step number, where a body runs on fake tensors), ``_flat`` (from the public functions' pytrees to
the operators' flat tensors). The public layer passes in what they need (the checked plan, the
protocol that reads what a step returns, with the public function's wording); they import
nothing from ``_scan``, ``_loop`` or ``theano``.

The operators follow ``torch/_higher_order_ops/scan.py``: a dense implementation (so that
``ExportedProgram.module()`` runs), a fake one for shapes, functionalization, and a tracing one
that records the body as a subgraph. Tracing also does what torch's own scan refuses to: outputs
that alias each other or an input (``return h, h``) get a copy, and tensors and sizes the body
captures by closure become explicit inputs.

Everything in this package uses torch's private APIs, all imported from ``torchscan._compat``.
"""

from torchscan._traced._flat import TypeCheck, traced_loop, traced_scan
from torchscan._traced._indexing import DataDependentSlice, on_fake_tensors
from torchscan._traced._loop_op import torchscan_loop
from torchscan._traced._lower import call_torch_scan
from torchscan._traced._scan_op import torchscan_scan

__all__ = [
    "DataDependentSlice",
    "TypeCheck",
    "call_torch_scan",
    "on_fake_tensors",
    "torchscan_loop",
    "torchscan_scan",
    "traced_loop",
    "traced_scan",
]
