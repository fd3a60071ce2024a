"""The deployment search's pareto.png holds what it says: axes, labels and every series' points."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from sglang_hydra.jobs import deploy_search  # noqa: E402
from sglang_hydra.jobs.deploy_eval import Sla  # noqa: E402


def row(mode, user, gpu, meets, layout="1 x TP1", status="ok"):
    return {"mode": mode, "tokens_per_s_per_user": user, "tokens_per_s_per_gpu": gpu, "meets_sla": meets,
            "layout": layout, "status": status}


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    rows = [row("agg", 60, 1000, True), row("agg", 40, 2000, True), row("agg", 50, 900, True),
            row("agg", 10, 3000, False), row("disagg", 55, 1500, True, "1P + 1D"),
            row("disagg", 5, 100, False, status="rejected")]
    best = rows[1]
    deploy_search._pareto(tmp_path / "pareto.png", rows, best, False, Sla(1000, 25))
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(figures) == 1
    yield figures[0], rows
    real_close(figures[0])


def _points(collection):
    return sorted(map(tuple, collection.get_offsets().tolist()))


def test_axes_and_labels(drawn):
    fig, _ = drawn
    (ax,) = fig.axes
    assert ax.get_xlabel() == "tokens/s/user (mean over the requests)"
    assert ax.get_ylabel() == "output tokens/s/GPU"
    assert ax.get_title() == "Deployments: per-GPU throughput against per-user speed"
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0


def test_every_series_holds_its_deployments(drawn):
    fig, _ = drawn
    (ax,) = fig.axes
    series = {c.get_label(): _points(c) for c in ax.collections}
    assert series["agg (meets SLA)"] == [(40, 2000), (50, 900), (60, 1000)]
    assert series["agg (misses SLA)"] == [(10, 3000)]
    assert series["disagg (meets SLA)"] == [(55, 1500)]
    assert series["disagg (misses SLA)"] == []                     # the rejected one is not drawn
    assert series["best: agg 1 x TP1"] == [(40, 2000)]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    bound = lines["1 / TPOT bound (40)"]
    assert list(bound.get_xdata()) == [40.0, 40.0]
    # agg's frontier: the SLA-meeting points no other beats on both axes, by tokens/s/user
    frontier = [ln for ln in ax.get_lines() if ln is not bound]
    assert [list(zip(ln.get_xdata(), ln.get_ydata())) for ln in frontier] == [[(60, 1000), (40, 2000)]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "agg (meets SLA)", "agg (misses SLA)", "disagg (meets SLA)", "disagg (misses SLA)", "best: agg 1 x TP1",
        "1 / TPOT bound (40)"]
