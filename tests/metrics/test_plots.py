"""Plots render to PNG without a display and accept CSV paths, rows or run folders."""

import pytest

from geomx.metrics.progress import ProgressWriter
from geomx.metrics.summary import Summary, write_summary

from geomx.metrics import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _make_run(path, name, scale=1.0):
    with ProgressWriter(path / "progress.csv") as w:
        for i in range(1, 6):
            w.write(i * 10, i * scale, loss=1.0 / i, accuracy=min(1.0, 0.2 * i),
                    bytes_lan=i * 1_000_000, bytes_wan=i * 300_000, wall_s=i * 0.1)
        w.write(60, 6 * scale, loss=float("nan"), accuracy=None)  # gaps are skipped
    write_summary(path / "summary.json", Summary(
        scenario_name=name, emulated_seconds=6 * scale, runtime="emu",
        bytes_per_link={"wan:a-b": 1_500_000, "lan:a": 5_000_000}))
    return path


def _is_png(p):
    return p.exists() and p.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_accuracy_and_bytes_plots_write_pngs(tmp_path):
    run = _make_run(tmp_path, "r")
    plots.plot_accuracy(run / "progress.csv", tmp_path / "acc.png")
    plots.plot_accuracy(run, tmp_path / "acc_iter.png", time_axis="iteration")
    plots.plot_bytes(run / "progress.csv", tmp_path / "bytes.png")
    for name in ("acc.png", "acc_iter.png", "bytes.png"):
        assert _is_png(tmp_path / name)


def test_unknown_time_axis_is_an_error_naming_the_choices(tmp_path):
    run = _make_run(tmp_path, "r")
    with pytest.raises(ValueError, match="wall_s"):
        plots.plot_accuracy(run, None, time_axis="seconds")


def test_link_utilisation_puts_wan_links_first_on_their_own_scale(tmp_path):
    per_link = {"a->c": 1_500_000, "c->a": 750_000, "w:a:0->sw:a": 5_000_000_000,
                "sw:a->ls:a": 4_000_000_000}
    caps = {"a->c": 10e6, "w:a:0->sw:a": 10e9}
    fig = plots.plot_link_utilisation(per_link, 6.0, caps, tmp_path / "u.png")
    assert _is_png(tmp_path / "u.png")
    wan, lan = fig.axes
    assert wan.get_title(loc="left") == "WAN links (2)" and lan.get_title(loc="left") == "LAN links (2)"
    assert [t.get_text() for t in wan.get_yticklabels()] == ["c->a", "a->c"]  # busiest on top
    # each panel is scaled to its own links: the 2 Mbit/s WAN bar spans its axis
    assert wan.get_xlim()[1] == pytest.approx(2.0 * 1.35)
    labels = [t.get_text() for t in wan.texts]
    assert "2 Mbit/s (20%)" in labels and "1 Mbit/s" in labels  # utilisation where known
    fig = plots.plot_link_utilisation({"w:a:0->sw:a": 1000}, 6.0, None, None)
    assert len(fig.axes) == 1 and fig.axes[0].get_title(loc="left") == "LAN links (1)"
    with pytest.raises(ValueError, match="duration_s"):
        plots.plot_link_utilisation(per_link, 0, None, None)
    assert plots.is_wan_link("party-a->central") and not plots.is_wan_link("sw:c->gs:0")


def test_compare_runs_overlays_one_line_per_run(tmp_path):
    a = _make_run(tmp_path / "a", "fsa")
    b = _make_run(tmp_path / "b", "hfa", scale=0.5)
    fig = plots.compare_runs([a, b], tmp_path / "cmp.png")
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["fsa", "hfa"]
    assert _is_png(tmp_path / "cmp.png")


def test_write_run_plots_writes_the_standard_set(tmp_path):
    run = _make_run(tmp_path, "r")
    written = plots.write_run_plots(run, {"wan:a-b": 10e6})
    assert sorted(p.name for p in written) == ["accuracy.png", "bytes.png", "link_utilisation.png"]
    assert all(_is_png(p) for p in written)


def test_byte_unit_scales():
    assert plots.byte_unit(2.5e9) == (1e9, "GB")
    assert plots.byte_unit(0) == (1.0, "B")
