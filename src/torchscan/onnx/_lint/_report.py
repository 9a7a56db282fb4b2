"""What ``torchscan.onnx.check`` found: lint findings, runtime comparisons, and their rendering.

The report is plain frozen data, so that it can be compared in tests, turned into JSON for other
tools, and rendered as tables by ``rich`` (``print(report)`` or ``rich.print(report)``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

OK = "ok"
FAILED = "failed"
NOT_COMPARED = "not compared"
MISMATCH = "mismatch"
UNSUPPORTED = "unsupported"
ERROR = "error"
TIMEOUT = "timeout"
COULD_NOT_RUN = "could not run"
BASELINE = "baseline"
_FAILING = (MISMATCH, ERROR, TIMEOUT)
_RAN = (OK, MISMATCH, BASELINE)
RANDOM = "random"
"""Why the values of an output are not compared: they depend on a random operator."""
UNSUPPORTED_TEXT = "not supported by that runtime"
"""How the text report says ``"unsupported"``: a runtime that does not run the model."""
BASELINES = ("expected", "pytorch")
"""The sources that do not read the ONNX model: the expected outputs, and eager PyTorch."""
NO_BASELINE = (
    "no PyTorch baseline took part: the runtimes were held against each other only, so a "
    "model that computes the wrong thing the same way in every runtime (a wrong weight, a scan "
    "run in the wrong direction) passes. Give the PyTorch module (--module, module=) or the "
    "expected outputs (output_*.pb files next to the inputs, expected=) to catch it."
)
"""The note of a report whose outputs were compared without a PyTorch baseline."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rule of the ONNX specification that one ``Scan`` or ``Loop`` node breaks.

    Attributes:
      node: the node, with its path through the bodies that hold it, as in
        ``"Loop 'outer' > body > Scan #0"`` (``#i``: the i-th node of its graph, for a node
        without a name).
      op: the operator version in force for the node, as in ``"Scan-9"``.
      rule: the rule's id, as in ``"scan-axis-range"``; ``docs/check.md`` lists them all.
      message: what is wrong, naming the values involved.
      spec: the sentence of the specification the rule comes from, quoted.
      source: where the quote is, as in ``"Scan-11, attribute scan_input_axes"``.
    """

    node: str
    op: str
    rule: str
    message: str
    spec: str
    source: str

    def __str__(self) -> str:
        where = f"{self.node} ({self.op}) [{self.rule}]"
        return f"{where}: {self.message} Spec ({self.source}): “{self.spec}”"


@dataclasses.dataclass(frozen=True)
class CheckedNode:
    """One node that was linted, or found: its path and the version in force (as in
    ``"Scan-16"``)."""

    node: str
    op: str


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    """How far one output of one runtime is from the same output of the baseline.

    Attributes:
      name: the model's name for the output.
      shape: the output's shape as text (``"(3, 2)"``, or ``"seq[2]"`` for a sequence).
      max_abs: the largest absolute difference, ``math.inf`` where values cannot be compared
        (a NaN on one side only, an infinity against a finite value), None where the shapes,
        types or sequence lengths differ, or where the values are not compared.
      max_rel: the largest difference relative to the baseline's value, over the elements where
        that value is not zero (an element that differs from a zero counts as ``math.inf``).
      ok: whether every element ``a`` is within ``atol + rtol * |b|`` of the baseline's ``b``
        (NaNs in the same places agree), with the same shape and element type.
      note: why the output does not agree, where it is not a matter of tolerance.
      not_compared: why its values were not compared, or ``""`` where they were: ``"random"``
        for an output that depends on a random operator (``RandomNormal``, ``Bernoulli``, ...,
        or a ``Scan``, ``Loop`` or ``If`` whose body holds one), whose values no two sources
        draw alike; ``ok`` then says whether its shape and element type agree.
    """

    name: str
    shape: str
    max_abs: float | None
    max_rel: float | None
    ok: bool
    note: str = ""
    not_compared: str = ""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One source of outputs (a runtime, or eager PyTorch) held against the baseline.

    Attributes:
      source: ``"onnxruntime"``, ``"onnxruntime-unoptimized"``, ``"reference"``
        (``onnx.reference.ReferenceEvaluator``), ``"imported"`` (the module
        ``torchscan.onnx.to_torch`` makes of the model), ``"pytorch"`` (the module given to
        compare with) or ``"expected"``.
      against: the baseline's source; ``source`` itself for the baseline, and empty where no
        source gave outputs.
      status: ``"ok"``, ``"mismatch"`` (an output out of tolerance), ``"unsupported"`` (the
        runtime does not run this model; not a failure), ``"could not run"`` (the runtime
        failed on a model that ``onnx.checker`` accepts, while at least two independent
        sources ran it; not a failure), ``"error"`` (it failed otherwise), ``"timeout"`` (it
        did not end within the time limit, and was stopped) or ``"baseline"``.
      reason: for ``"unsupported"``, ``"could not run"``, ``"error"`` and ``"timeout"``, why,
        in one line (as in ``"timed out after 60 s"``).
      outputs: one entry per output compared.
    """

    source: str
    against: str
    status: str
    reason: str = ""
    outputs: tuple[OutputDiff, ...] = ()

    @property
    def ok(self) -> bool:
        """False for a mismatch, an error or a timeout, True otherwise."""
        return self.status not in _FAILING


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """Everything ``torchscan.onnx.check`` found about one model.

    Attributes:
      model: the model's path, or ``"<bytes>"`` / ``"<ModelProto>"``.
      opset: the model's default-domain opset.
      nodes: every ``Scan`` and ``Loop`` node checked, with the version in force for it.
      findings: the rules broken, in the order of the nodes.
      comparisons: one per source of outputs; empty where nothing was run.
      inputs: the inputs the model was run on, one ``"name: type[shape]"`` each, with where
        they came from first.
      atol: the absolute tolerance of the comparisons.
      rtol: the relative tolerance of the comparisons.
      notes: things worth knowing that are not failures.
      timeout: the seconds each source could run, or None for no limit.
      strict: whether a check that fewer than two independent sources ran (the verdict
        ``"not compared"``) fails; False where the user accepted a single source.
      other_nodes: the ``If`` nodes, linted by the rules of ``If``, and the ``RNN``, ``GRU``
        and ``LSTM`` nodes, which no rule lints (their outputs are compared as any others), with
        the version in force for each.
    """

    model: str
    opset: int | None
    nodes: tuple[CheckedNode, ...]
    findings: tuple[Finding, ...]
    comparisons: tuple[Comparison, ...]
    inputs: tuple[str, ...]
    atol: float
    rtol: float
    notes: tuple[str, ...] = ()
    timeout: float | None = None
    strict: bool = True
    other_nodes: tuple[CheckedNode, ...] = ()

    @property
    def verdict(self) -> str:
        """``"failed"`` where a rule is broken or an output disagrees or fails to be computed
        (a runtime that ``"could not run"`` a valid model that two other sources ran is no
        failure); else ``"not compared"`` where the model was run but fewer than two
        independent sources gave outputs (nothing was held against anything); else ``"ok"``."""
        if self.findings or not all(c.ok for c in self.comparisons):
            return FAILED
        if self.comparisons and len(self.independent) < 2:
            return NOT_COMPARED
        return OK

    @property
    def ok(self) -> bool:
        """True when the verdict is ``"ok"``, or ``"not compared"`` where the user accepted a
        single source (``strict=False``)."""
        return self.verdict == OK or (self.verdict == NOT_COMPARED and not self.strict)

    @property
    def ran(self) -> tuple[str, ...]:
        """The sources that ran the model and gave outputs: the baseline, and the sources held
        against it."""
        return tuple(c.source for c in self.comparisons if c.status in _RAN)

    @property
    def independent(self) -> tuple[str, ...]:
        """The independent sources among :attr:`ran`: onnxruntime at its two optimization
        levels is one runtime."""
        return tuple(dict.fromkeys(_family(source) for source in self.ran))

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data; infinite errors become ``"inf"``. Its ``"status"`` is
        the verdict, ``"ok"``, ``"failed"`` or ``"not compared"`` (an error document of the
        command has ``"error"``); ``"ok"`` says whether the check passed."""
        data = {"status": self.verdict, **dataclasses.asdict(self)}
        data["ok"] = self.ok
        for comparison in data["comparisons"]:
            for output in comparison["outputs"]:
                output["max_abs"] = _json_number(output["max_abs"])
                output["max_rel"] = _json_number(output["max_rel"])
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The report as a JSON document (strict JSON: no NaN or Infinity literals)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)

    @property
    def baseline_took_part(self) -> bool:
        """Whether outputs that do not come from the ONNX model took part: the expected
        outputs, or eager PyTorch's. Without them, the runtimes are held against each other
        only, and a model that computes the wrong thing the same way in each passes."""
        return any(c.source in BASELINES for c in self.comparisons)

    def summary(self) -> str:
        """One line: the verdict, and why."""
        failing = [c for c in self.comparisons if not c.ok]
        linted = self._linted()
        if self.verdict == OK:
            could = [c.source for c in self.comparisons if c.status == COULD_NOT_RUN]
            why = f"; {', '.join(could)} could not run the model" if could else ""
            if any(c.status == OK for c in self.comparisons) and not self.baseline_took_part:
                why += "; no PyTorch baseline or expected outputs took part"
            return f"OK: {linted}, no findings{_agreement(self.comparisons)}{why}"
        if self.verdict == NOT_COMPARED:
            accepted = "" if self.strict else " (a single source was accepted)"
            return f"NOT COMPARED: {linted}, no findings; {_too_few(self.comparisons)}{accepted}"
        parts = [_count(len(self.findings), "finding")] if self.findings else []
        parts += [f"{c.source} {_SUMMARY.get(c.status, c.status)}" for c in failing]
        return "FAILED: " + ", ".join(parts)

    def _linted(self) -> str:
        """What the lint checked, for the summary: the Scan and Loop nodes, else the If nodes."""
        if self.nodes:
            return f"{_count(len(self.nodes), 'Scan/Loop node')} checked"
        ifs = sum(1 for n in self.other_nodes if n.op.startswith("If-"))
        if ifs:
            return f"{_count(ifs, 'If node')} checked"
        return "no Scan, Loop or If node to lint"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(f"torchscan check: {self.model} (opset {self.opset})", style="bold")
        if self.nodes:
            yield _nodes_table(self)
        if self.other_nodes:
            yield _nodes_table(self, others=True)
        if self.findings:
            yield _findings_table(self.findings)
        if self.comparisons:
            yield _comparisons_table(self)
        for c in self.comparisons:
            if c.status in (UNSUPPORTED, COULD_NOT_RUN, ERROR, TIMEOUT):
                yield Text(f"{c.source}: {_status_text(c.status, c.reason)}")
        for note in self.notes:
            yield Text(f"note: {note}", style="dim")
        yield Text(self.summary(), style="bold green" if self.ok else "bold red")

    def __str__(self) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=120, color_system=None, force_terminal=False)
        console.print(self, soft_wrap=True)  # lines of text unbroken, tables 120 wide
        return buffer.getvalue().rstrip() + "\n"


def _agreement(comparisons: tuple[Comparison, ...]) -> str:
    """What the comparisons of a passing report come to, for its summary: which sources agree,
    or which ran and which did not, and why not in a word (the report's lines above say more)."""
    if not comparisons:
        return ""
    ran = [c.source for c in comparisons if c.status in (OK, BASELINE)]
    if len(ran) > 1:
        outputs = [o for c in comparisons if c.status == OK for o in c.outputs]
        random = list(dict.fromkeys(o.name for o in outputs if o.not_compared == RANDOM))
        if not random:
            return f"; outputs agree across {', '.join(ran)}"
        every = set(random) == {o.name for o in outputs}
        agree = "shapes and element types" if every else "outputs"
        return (
            f"; {agree} agree across {', '.join(ran)}; values not compared: random "
            f"({', '.join(random)})"
        )
    return f"; {_too_few(comparisons)}"


def _too_few(comparisons: tuple[Comparison, ...]) -> str:
    """That fewer than two independent sources ran the model, which did, and why the others did
    not."""
    ran = [c.source for c in comparisons if c.status in _RAN]
    families = list(dict.fromkeys(_family(source) for source in ran))
    others = [c for c in comparisons if c.source not in ran]
    why = "; ".join(f"{c.source}: {_status_text(c.status, '')}" for c in others)
    why = f" ({why})" if why else ""
    return (
        f"too few independent sources ran the model to compare outputs: "
        f"{f'only {families[0]}' if families else 'none'} ran{why}"
    )


def _family(source: str) -> str:
    """The runtime a source is: onnxruntime's two optimization levels are one."""
    return "onnxruntime" if source.startswith("onnxruntime") else source


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _json_number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "inf" if x > 0 else "nan"


def _format_error(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return "inf" if math.isinf(x) else f"{x:.3g}"


def _nodes_table(report: CheckReport, others: bool = False) -> Table:
    """The Scan and Loop nodes linted, or (``others``) the If and recurrent nodes, with their
    lint's findings."""
    counts: dict[str, int] = {}
    for finding in report.findings:
        counts[finding.node] = counts.get(finding.node, 0) + 1
    title = "If and recurrent nodes" if others else "Scan and Loop nodes"
    nodes = Table(title=title, title_justify="left")
    nodes.add_column("node")
    nodes.add_column("version")
    nodes.add_column("lint")
    for checked in report.other_nodes if others else report.nodes:
        found = counts.get(checked.node, 0)
        if others and not checked.op.startswith("If"):
            lint = "no rules (outputs compared)"
        elif others and " " in checked.op:  # no version in force: not linted
            lint = "not checked"
        else:
            lint = _count(found, "finding") if found else "ok"
        nodes.add_row(checked.node, checked.op, lint)
    return nodes


def _findings_table(findings: tuple[Finding, ...]) -> Table:
    out = Table(title="Findings", title_justify="left", show_lines=True)
    out.add_column("node")
    out.add_column("rule")
    out.add_column("finding", ratio=3)
    out.add_column("specification", ratio=2)
    for f in findings:
        out.add_row(f"{f.node}\n({f.op})", f.rule, f.message, f"“{f.spec}”\n({f.source})")
    return out


def _comparisons_table(report: CheckReport) -> Table:
    against = next((c.source for c in report.comparisons if c.status == BASELINE), None)
    tolerance = f"atol {report.atol:g}, rtol {report.rtol:g}"
    title = f"Outputs against {against} ({tolerance})" if against else "Outputs (none computed)"
    out = Table(title=title, title_justify="left")
    for column in ("source", "output", "shape", "max abs err", "max rel err", "result"):
        out.add_column(column, justify="right" if column.startswith("max") else "left")
    for c in report.comparisons:
        if not c.outputs:  # the reason is on a line of its own, below the table
            out.add_row(c.source, "", "", "", "", _status_text(c.status, ""))
        for o in c.outputs:
            result = c.status if c.status == BASELINE else (OK if o.ok else MISMATCH)
            if o.not_compared and result == OK:
                result = f"not compared: {o.not_compared}"
            note = f": {o.note}" if o.note else ""
            out.add_row(
                c.source,
                o.name,
                o.shape,
                _format_error(o.max_abs),
                _format_error(o.max_rel),
                _status_text(result, note.lstrip(": ")),
            )
    return out


_SUMMARY = {TIMEOUT: "timed out"}
"""How the last line of the report says a failing status, where not as the status itself."""


def _status_text(status: str, reason: str) -> str:
    if status == TIMEOUT:  # the reason says it whole: "timed out after 60 s"
        return reason or "timed out"
    label = {UNSUPPORTED: UNSUPPORTED_TEXT}.get(status, status)  # "could not run" as it is
    return f"{label}: {reason}" if reason else label
