"""A report from memory says what its data are (issue 38 item 6): the fit's own tensors are labelled
in-sample, other tensors "passed to the report", a Dataset's test split held out; no file a report
from memory lacks is mentioned; the selection is in the header; the coverage figure's legend never
squeezes the plot — checked in a real headless browser (Chromium) where one is installed."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from inference import fit
from lab.report import plots, write_report
from lab.report.html import Section, image, page
from zoo import BayesianNetwork, GaussianLikelihood
from zoo.architectures import MLP

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.fixture(scope="module")
def fitted():
    """A MAP fit of a last-layer MLP on 40 points of a sine, its training tensors (model units)."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 40).unsqueeze(1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(40, 1)
    bnn = BayesianNetwork(MLP(1, 1, hidden=(8,)), "last", likelihood=GaussianLikelihood(learn_noise=True),
                          example_input=x[:2])
    return fit(bnn, x, y, backend="map", epochs=30, progress=False), x, y


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html).replace("&#39;", "'")


def test_the_fits_own_tensors_are_labelled_in_sample(fitted, tmp_path):
    posterior, x, y = fitted
    for data in ((x, y), (x.clone().double(), y.clone().double())):  # the tensors themselves, or equal copies
        text = _text(write_report(posterior, tmp_path / "r.html", data=data).read_text())
        assert "In-sample metrics: the fit's own 40 training points, not held out" in text
        assert "in-sample lppd (40 points)" in text and "so it is optimistic" in text
        assert "PSIS-LOO and WAIC on all 40 training points (the data the posterior was fitted to)" in text
        assert "held-out" not in text and "Test metrics" not in text and "test lppd" not in text


def test_other_tensors_are_labelled_as_passed_to_the_report(fitted, tmp_path):
    posterior, x, y = fitted
    shifted = (x + 0.05, y)
    text = _text(write_report(posterior, tmp_path / "r.html", data=shifted).read_text())
    assert "Metrics on the 40 points passed to the report" in text and "evaluation lppd" not in text
    assert "are not the ones the posterior was fitted to" in text  # LOO does not apply to other points
    four = (x, y, x[:10] + 0.05, y[:10])  # the fit's points for LOO, other points evaluated
    text = _text(write_report(posterior, tmp_path / "r.html", data=four).read_text())
    assert "Metrics on the 10 points passed to the report" in text
    assert "on all 40 training points (the data the posterior was fitted to)" in text
    assert "evaluation lppd (10 points)" in text


def test_a_posterior_without_a_fingerprint_says_its_training_data_are_unchecked(fitted, tmp_path):
    posterior, x, y = fitted
    fingerprint = posterior.info.pop("data_fingerprint")
    try:
        text = _text(write_report(posterior, tmp_path / "r.html", data=(x, y)).read_text())
    finally:
        posterior.info["data_fingerprint"] = fingerprint
    assert "Metrics on the 40 points passed to the report" in text
    assert "could not be checked to be the points it was fitted to" in text


def test_a_report_from_memory_names_no_missing_file_and_shows_its_selection(fitted, tmp_path):
    posterior, x, y = fitted
    html = write_report(posterior, tmp_path / "r.html", data=(x, y)).read_text()
    text = _text(html)
    for absent in ("config.json", "posterior.nc", "train.nc", "metrics.json", "stochastic=?"):
        assert absent not in text, absent
    assert "stochastic=last" in re.search(r'<p class="meta">([^<]*)', html).group(1)
    assert "Model" in text and "out.weight, out.bias" in text  # the model's record in place of a run spec


def test_the_coverage_legend_sits_below_a_plot_of_constant_size():
    """However long or many the runs' names, the axes keep their width and height."""
    from matplotlib.figure import Figure

    levels = np.linspace(0.05, 0.99, 20)
    sizes = []
    for names in (["this run"], ["data passed to the report-Sequential(Linear, Tanh, Linear)-map-seed0" * 3 + str(i)
                                 for i in range(5)]):
        captured = {}
        original = plots.png
        plots.png = lambda fig: captured.setdefault("fig", fig) and original(fig)
        try:
            plots.coverage_png({name: (levels, levels) for name in names})
        finally:
            plots.png = original
        fig: Figure = captured["fig"]
        fig.canvas.draw()
        box = fig.axes[0].get_window_extent()
        sizes.append((round(box.width), round(box.height)))
        legend = fig.legends[0].get_window_extent()
        assert legend.y1 <= box.y0 and legend.x0 >= 0 and legend.x1 <= fig.bbox.width  # below, inside the figure
    assert abs(sizes[0][0] - sizes[1][0]) <= 2 and abs(sizes[0][1] - sizes[1][1]) <= 2, sizes


# ---------------------------------------------------------------------- in a real browser
#: runs at load: measures the page and, on a canvas, each figure's longest dark horizontal run (an axes
#: spine) and its dark pixels on the image's border (a label cut off); writes them as JSON into the page
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const out = {innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, images: []};
  for (const img of document.images) {
    const c = document.createElement("canvas"); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext("2d"); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let longest = 0, border = 0;
    for (let y = 0; y < c.height; y++) {
      let run = 0;
      for (let x = 0; x < c.width; x++) {
        const i = 4 * (y * c.width + x);
        const dark = d[i] < 90 && d[i + 1] < 90 && d[i + 2] < 90 && d[i + 3] > 200;
        run = dark ? run + 1 : 0;
        longest = Math.max(longest, run);
        if (dark && (x === 0 || x === c.width - 1 || y === c.height - 1)) border++;
      }
    }
    const r = img.getBoundingClientRect();
    out.images.push({alt: img.alt, naturalWidth: img.naturalWidth, shownWidth: r.width, right: r.right,
                     longestDarkRun: longest, darkOnBorder: border});
  }
  const pre = document.createElement("pre"); pre.id = "layout-probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def browser_layout(html: str, tmp_path) -> dict:
    """Load ``html`` in headless Chromium (the page's no-script policy lifted for the probe) and return
    what :data:`LAYOUT_PROBE` measured."""
    probed = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html).replace(
        "</body>", LAYOUT_PROBE + "</body>")
    page_file = tmp_path / "probe.html"
    page_file.write_text(probed, encoding="utf-8")
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900", "--virtual-time-budget=10000",
               "--dump-dom", page_file.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium exited {done.returncode} without the probe's output: {done.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_the_report_lays_out_in_a_browser(fitted, tmp_path):
    posterior, x, y = fitted
    layout = browser_layout(write_report(posterior, tmp_path / "r.html", data=(x, y)).read_text(), tmp_path)
    assert layout["scrollWidth"] <= layout["innerWidth"]  # nothing runs off the page sideways
    images = {img["alt"]: img for img in layout["images"]}
    assert {"coverage vs nominal", "PIT histogram", "predictive bands"} <= set(images)
    for img in layout["images"]:
        assert img["naturalWidth"] > 0 and img["right"] <= layout["innerWidth"], img  # decoded, on the page
        assert img["darkOnBorder"] == 0, img  # no label cut off at the figure's edge
    coverage = images["coverage vs nominal"]
    assert coverage["longestDarkRun"] >= 0.6 * coverage["naturalWidth"], coverage  # the plot is not a strip


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_the_browser_probe_sees_a_squeezed_plot(tmp_path):
    """The probe can fail: a legend inside the axes, sized by a long name, squeezes them to a strip."""
    levels = np.linspace(0.05, 0.99, 20)
    fig, (ax,) = plots._figure(width=4.2, height=3.6)
    ax.plot(levels, levels, label="data passed to the report-Sequential(Linear, Tanh, Linear, Tanh, Linear)-map")
    ax.set(xlabel="nominal level of the central interval", xlim=(0, 1), ylim=(0, 1))
    ax.legend(fontsize=8)
    html = page("squeezed", "", [Section("Calibration", image(plots.png(fig), "coverage vs nominal"))])
    coverage = browser_layout(html, tmp_path)["images"][0]
    assert coverage["longestDarkRun"] < 0.6 * coverage["naturalWidth"] or coverage["darkOnBorder"] > 0
