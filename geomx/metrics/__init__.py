"""Metrics: events -> events.jsonl, progress.csv, summary.json, trace.json and plots.

Everything here is runtime-agnostic: the emulator and the real runtime feed the same
`EventRecorder` and leave the same run folder. `geomx.metrics.plots` is not imported
here so that using the recorder does not pull in matplotlib.
"""

from geomx.metrics.chrome_trace import chrome_trace_events, convert_events_file, write_chrome_trace
from geomx.metrics.counters import ByteCounters, dc_from_node_name
from geomx.metrics.progress import (
    PROGRESS_COLUMNS,
    ProgressBar,
    ProgressRow,
    ProgressWriter,
    read_progress,
)
from geomx.metrics.recorder import (
    EventRecorder,
    canonical_dumps,
    iter_events,
    merge_event_files,
    round_float,
)
from geomx.metrics.summary import (
    Run,
    Summary,
    build_summary,
    load_run,
    read_summary,
    time_to_target,
    write_summary,
)

__all__ = [
    "PROGRESS_COLUMNS",
    "ByteCounters",
    "EventRecorder",
    "ProgressBar",
    "ProgressRow",
    "ProgressWriter",
    "Run",
    "Summary",
    "build_summary",
    "canonical_dumps",
    "chrome_trace_events",
    "convert_events_file",
    "dc_from_node_name",
    "iter_events",
    "load_run",
    "merge_event_files",
    "read_progress",
    "read_summary",
    "round_float",
    "time_to_target",
    "write_chrome_trace",
    "write_summary",
]
