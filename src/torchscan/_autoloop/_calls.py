"""What converted code calls: the namespace a converted function reads as ``__autoloop__``
(``_rewrite.RUNTIME``), every public name of the runtime's modules, each defined in the module
of what it works on: the loops (``_runtime``: ``for_``, ``kept``, ``runs_as_written``;
``_while``: ``while_``, ``going``, ``as_written``), and the values they iterate over, append to
and write (``_values``)."""

from __future__ import annotations

from torchscan._autoloop import _base, _runtime, _values, _while

API = _base.API
AS_WRITTEN_BELOW = _runtime.AS_WRITTEN_BELOW
Loop = _base.Loop
Range = _values.Range
Rows = _values.Rows
STOP = _values.STOP
StackedList = _values.StackedList
UNDEFINED = _base.UNDEFINED
Unbound = _values.Unbound
any_tensor = _values.any_tensor
as_written = _while.as_written
augmented = _values.augmented
cat = _values.cat
chosen = _values.chosen
chunk_ = _values.chunk_
enumerate_ = _values.enumerate_
flag_ = _values.flag_
for_ = _runtime.for_
going = _while.going
item_ = _values.item_
kept = _runtime.kept
len_ = _values.len_
list_ = _values.list_
not_ = _values.not_
plan_is_time = _runtime.plan_is_time
put = _values.put
range_ = _values.range_
reversed_ = _values.reversed_
rows = _values.rows
runs_as_written = _runtime.runs_as_written
select = _values.select
slice_ = _values.slice_
slot = _values.slot
split_ = _values.split_
split_rows = _values.split_rows
stack = _values.stack
stops = _values.stops
unbind = _values.unbind
unstopped = _values.unstopped
until_ = _values.until_
while_ = _while.while_
write = _values.write
write_out = _values.write_out
zip_ = _values.zip_
