"""The check tool behind ``torchscan check`` and ``torchscan.onnx.check``, one module per concern:
``_compare`` (``check``, and running the runtimes against a baseline), ``_inputs`` and
``_random`` (given and random inputs), ``_runtimes`` (onnxruntime, in a child process where a
crash is plausible, onnx's reference evaluator with the operators of ``_reference_ops`` and a
``Loop`` that follow the specification, the module ``torchscan.onnx.to_torch`` makes of the
model, ``"imported"``, and eager PyTorch), ``_limit`` (each of them within a time limit, stopped
at once on Ctrl-C) and ``_diff`` (outputs against the baseline's). The lint, the model read for
it and the report are in :mod:`torchscan.onnx._lint`. Importing the package imports none of
them: ``torchscan.onnx`` loads ``check`` and the report classes from their modules when first
used, so that an export imports neither the check tool nor ``rich``.
"""
