"""The check tool behind ``torchscan check`` and ``torchscan.onnx.check``, one module per concern:
``_compare`` (``check``, and running the runtimes against a baseline), ``_load`` (reading model
files, with a parser of the protobuf wire format that says what is wrong with a corrupt one, and
reading the model into onnx_ir once, as given and with the types ONNX shape inference adds, for
every analysis: protobuf stays there, in the reader of ``.pb`` test data and in the runtimes,
as ``tests/onnx/test_check_ir.py`` holds),
``_inputs`` and ``_random`` (given and random inputs), ``_runtimes`` (onnxruntime, in a child
process where a crash is plausible, onnx's reference evaluator with the operators of
``_reference_ops`` and a ``Loop`` that follow the specification, the module
``torchscan.onnx.to_torch`` makes of the model, ``"imported"``, and eager PyTorch), ``_limit``
(each of them within a time limit, stopped at once on Ctrl-C), ``_diff``
(outputs against the baseline's), ``_lint`` (the lint's driver), ``_rules`` (the rule table and the
words of the specification), ``_site`` and ``_shared_rules`` (what the Scan and Loop rules share),
``_scan_rules``, ``_loop_rules``, ``_if_rules``, and ``_report`` (the report, rendered by
``rich``). Importing the package imports none of them: ``torchscan.onnx`` loads ``check`` and
the report classes from their modules when first used, so that an export imports neither the
check tool nor ``rich``.
"""
