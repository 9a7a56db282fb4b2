"""The export of torchscan's loops through ``torch.onnx.export``: the translations of the traced
operators into ONNX ``Scan`` and ``Loop`` (``_translate``), the hooks installed in torch.onnx's
exporter (``_hooks``), the passes a model with loops goes through (``_passes``), the element
types each loop version allows (``_element_types``), the shape of loops that may run no
iteration (``_empty_loops``), moving loop-invariant work out of ONNX bodies
(``_hoist_bodies``), the export settings (``_options``) and the conversion below opset 18
(``_convert``). docs/export.md says what an export does; docs/architecture.md, which layer each
module is in.
"""
