"""The rules of the ONNX specification for ``Scan``, ``Loop`` and ``If`` nodes, which
``torchscan check`` reports and ``torchscan.onnx.to_torch`` refuses a model by: the driver that
visits every node (``_driver``), the rule table and the words of the specification
(``_rules``), the node being linted (``_site``), the rules (``_shared_rules``, ``_scan_rules``,
``_loop_rules``, ``_if_rules``), the model read for them (``_load``) and the report the findings
go in (``_report``).
"""
